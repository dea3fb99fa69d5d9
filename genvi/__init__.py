"""genvi: programmable variational inference on JAX.

Models and guides are `@gv.gen` programs; objectives are `@gv.expectation` programs;
every sampling site carries a gradient strategy; ADEV compiles an objective into an
unbiased gradient estimator that is one jitted JAX function.

Example:
    >>> import genvi as gv, jax
    >>> @gv.gen
    ... def model(m, y):
    ...     z = gv.normal(0.0, 1.0) @ "z"
    ...     gv.observe(gv.normal(z, 1.0), y)
    >>> @gv.gen
    ... def guide(m, y):
    ...     gv.normal(m, 0.7, grad=gv.REPARAM) @ "z"
    >>> grads = gv.elbo(model, guide).grad_estimate(jax.random.key(0), 0.0, 1.0)
"""

from genvi.adev import dual
from genvi.adev.continuation import Deferred
from genvi.adev.batch_mean import batch_mean
from genvi.adev.expectation import Expectation
from genvi.adev.functionals import average, exp
from genvi.adev.program import expectation
from genvi.adev.sample import sample
from genvi.adev.smoothness import DiscontinuityError
from genvi.adev.variance_training import VarianceTrainingError
from genvi.adev.strategies import (ENUM, MVD, REINFORCE, RELAX, REPARAM, RLOO, SD, SWOR,
                                   DisARM, decaying_average)
from genvi.adev.switch import switch
from genvi.core.choices import ChoiceMap, choices
from genvi.core.program_mistakes import TracedConditionError, UnusedStrategyWarning
from genvi.core.scopes import assume_continuous
from genvi.core.continuation import Continuation, Continued
from genvi.core.strategy import RunState, Strategy
from genvi.core.validation import InvalidParameters, set_validation, validation
from genvi.distributions.base import DistCall, Distribution
from genvi.distributions.continuous import (Beta, Dirichlet, Gamma, MvNormal, MvNormalDiag,
                                            Normal, Uniform)
from genvi.distributions.binary import Bernoulli, Flip, bernoulli, flip
from genvi.distributions.discrete import Binomial, Categorical, Geometric, Poisson
from genvi.distributions.time_series import GaussianRandomWalk
from genvi.distributions.priors import (Exponential, HalfCauchy, HalfNormal, Laplace, LogNormal,
                                        StudentT)
from genvi.interop.tfp import from_tfp
import sys as _sys

from genvi.gen import handlers
from genvi.gen.combinators import repeat, scan, vmap
from genvi.gen.handlers import UnnormalizedError
from genvi.gen.language import GenFn, Trace, deterministic, factor, gen, observe
from genvi.gen.plate import plate
from genvi.gen.predictive import predictive
from genvi.guides.auto import AutoGuide
from genvi.guides.flow import auto_flow
from genvi.guides.delta import auto_delta
from genvi.guides.gaussian import auto_low_rank, auto_mvn, auto_normal
from genvi.guides.init_rules import init_to_median, init_to_sample, init_to_uniform, init_to_value
from genvi.guides.params import (Constrained, constrain, interval, lower_cholesky, positive,
                                 simplex, unit_interval)
from genvi.objectives.control_variates import dreg, vimco
from genvi.objectives.elbo import elbo, iwelbo, renyi
from genvi.objectives.smc import fivo, smc
from genvi.inference.enumeration import enumeration
from genvi.replays.engine import whole_objective_replays
from genvi.interop import from_numpyro
from genvi.inference.importance import importance, marginal, normalize
from genvi.inference.arviz_export import to_arviz
from genvi.inference.diagnose import Diagnosis, diagnose
from genvi.objectives.wake_sleep import forward_kl_sir, sleep_guide, wake_guide, wake_model
from genvi.training.checkpoints import CheckpointError, CheckpointWarning
from genvi.training.fit import FitResult, fit
from genvi.training.fit_options import Checkpoints, Evaluation, SkipNonfinite
from genvi.training.step import TrainState, TrainingStep, training_step
from genvi.training.schedule import Schedule, schedule
from genvi.training.stopping import Converged, converged
from genvi.training.fit_checks import NonFiniteError, NonFiniteWarning
from genvi.training.comparison import EstimatorComparison
from genvi.training.lab import compare_estimators
from genvi.auto.choices import AUTO
from genvi.auto.tune import Tuning, tune
from genvi.auto.fit_tuning import AutoTuning
from genvi.training.callbacks import FitCallback, FitStart
from genvi.training.plots import moving_average, plot_history

normal = Normal()
mv_normal_diag = MvNormalDiag()
mv_normal = MvNormal()
uniform = Uniform()
beta = Beta()
gamma = Gamma()
dirichlet = Dirichlet()
categorical = Categorical()
geometric = Geometric()
poisson = Poisson()
binomial = Binomial()
lognormal = LogNormal()
halfnormal = HalfNormal()
exponential = Exponential()
student_t = StudentT()
halfcauchy = HalfCauchy()
laplace = Laplace()
gaussian_random_walk = GaussianRandomWalk()

__version__ = "0.1.0"

# `gv.handlers` is also importable by its public path: `import genvi.handlers` and
# `from genvi.handlers import Simulate` give `genvi.gen.handlers` itself
_sys.modules.setdefault("genvi.handlers", handlers)

__all__ = [
    "AUTO",
    "Bernoulli",
    "Beta",
    "Binomial",
    "Categorical",
    "CheckpointError",
    "CheckpointWarning",
    "Checkpoints",
    "ChoiceMap",
    "Continuation",
    "Continued",
    "Converged",
    "Deferred",
    "DisARM",
    "DiscontinuityError",
    "Dirichlet",
    "DistCall",
    "Distribution",
    "ENUM",
    "EstimatorComparison",
    "Evaluation",
    "Expectation",
    "FitResult",
    "FitCallback",
    "FitStart",
    "AutoTuning",
    "Flip",
    "Gamma",
    "GaussianRandomWalk",
    "GenFn",
    "Geometric",
    "InvalidParameters",
    "MVD",
    "MvNormal",
    "MvNormalDiag",
    "NonFiniteError",
    "NonFiniteWarning",
    "Normal",
    "Poisson",
    "REINFORCE",
    "REPARAM",
    "RELAX",
    "RLOO",
    "RunState",
    "SD",
    "SWOR",
    "SkipNonfinite",
    "Schedule",
    "Strategy",
    "Tuning",
    "TrainState",
    "TrainingStep",
    "Trace",
    "TracedConditionError",
    "Uniform",
    "UnnormalizedError",
    "UnusedStrategyWarning",
    "VarianceTrainingError",
    "assume_continuous",
    "average",
    "batch_mean",
    "bernoulli",
    "beta",
    "binomial",
    "categorical",
    "choices",
    "compare_estimators",
    "converged",
    "decaying_average",
    "dirichlet",
    "dreg",
    "elbo",
    "enumeration",
    "exp",
    "expectation",
    "fit",
    "whole_objective_replays",
    "training_step",
    "fivo",
    "flip",
    "forward_kl_sir",
    "from_numpyro",
    "from_tfp",
    "gamma",
    "gen",
    "geometric",
    "importance",
    "iwelbo",
    "marginal",
    "mv_normal",
    "moving_average",
    "mv_normal_diag",
    "normal",
    "normalize",
    "factor",
    "observe",
    "deterministic",
    "plate",
    "plot_history",
    "poisson",
    "predictive",
    "renyi",
    "repeat",
    "sample",
    "schedule",
    "scan",
    "set_validation",
    "sleep_guide",
    "smc",
    "switch",
    "tune",
    "uniform",
    "validation",
    "vimco",
    "vmap",
    "wake_guide",
    "wake_model",
    "dual",
    "handlers",
    # the common priors of hierarchical models (genvi/distributions/priors.py)
    "Exponential",
    "HalfCauchy",
    "HalfNormal",
    "Laplace",
    "LogNormal",
    "StudentT",
    "exponential",
    "halfcauchy",
    "halfnormal",
    "laplace",
    "gaussian_random_walk",
    "lognormal",
    "student_t",
    # automatic guides and constrained parameters (genvi/guides)
    "AutoGuide",
    "Constrained",
    "auto_delta",
    "auto_flow",
    "auto_low_rank",
    "auto_mvn",
    "auto_normal",
    "constrain",
    "init_to_median",
    "init_to_sample",
    "init_to_uniform",
    "init_to_value",
    "interval",
    "lower_cholesky",
    "positive",
    "simplex",
    "unit_interval",
    # did it work? (genvi/inference/diagnose.py, arviz_export.py)
    "Diagnosis",
    "diagnose",
    "to_arviz",
]
