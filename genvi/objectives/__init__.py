"""The objective library: ELBO and IWELBO (more objectives build on these)."""
