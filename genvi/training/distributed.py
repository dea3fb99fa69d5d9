"""Data parallelism for `gv.fit(..., shard=True)`, on one process or several.

One mesh axis, "data", over every device of every process (`jax.devices()`); the
parameters and optimizer state are replicated, the data arrays split along their
leading axis. Under `jax.distributed` with P processes every process calls `gv.fit`
with the same objective, parameters, key and options and with *its own rows* of each
data argument: the global dataset is their concatenation in process order
(`jax.make_array_from_process_local_data`). A global batch of B rows is drawn as P
equal shares, each from one process's rows (no data crosses processes to be
gathered); without `batch_size` every step sees the whole global dataset, as a
one-process run on the concatenated data with the same number of devices does.
Results come back as ordinary (process-local, replicated) arrays; only process 0
reports progress.

Example:
    >>> from genvi.training.distributed import data_parallel
    >>> layout = data_parallel(False)
    >>> layout.batch is None, layout.processes
    (True, 1)
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class DataParallel(NamedTuple):
    """How `gv.fit` lays data out: shardings (None: one device, no sharding) and the
    number of processes whose rows make the global dataset."""

    batch: Any
    replicated: Any
    processes: int = 1


def data_parallel(shard: bool) -> DataParallel:
    """The layout for `gv.fit(..., shard=shard)`."""
    if not shard:
        return DataParallel(None, None, 1)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: PLC0415 - only when sharding
    mesh = Mesh(np.array(jax.devices()), ("data",))
    return DataParallel(NamedSharding(mesh, PartitionSpec("data")),
                        NamedSharding(mesh, PartitionSpec()), jax.process_count())


def place_data(data: tuple, layout: DataParallel) -> tuple:
    """Each process's rows as one global array per leaf (several processes), checked
    to be equal shares."""
    if layout.processes == 1:
        return data
    from jax.experimental import multihost_utils  # noqa: PLC0415 - only across processes
    leaves = jax.tree_util.tree_leaves(data)
    rows = {int(np.shape(x)[0]) for x in leaves if np.ndim(x)}
    if len(rows) > 1:
        raise ValueError(f"gv.fit(shard=True): this process's data arrays have different "
                         f"leading sizes {sorted(rows)}; pass each process's rows of every array")
    mine = rows.pop() if rows else 0
    every = np.asarray(multihost_utils.process_allgather(np.int64(mine)))
    if len(set(every.tolist())) > 1:
        raise ValueError(
            f"gv.fit(shard=True) under jax.distributed: the processes hold different numbers "
            f"of rows ({every.tolist()}, in process order); give every process an equal share "
            "(drop or pad the remainder)")
    if mine % jax.local_device_count():
        raise ValueError(f"gv.fit(shard=True): each process's {mine} rows must divide among "
                         f"its {jax.local_device_count()} devices")

    def place(x):
        if not np.ndim(x):
            return jax.device_put(jnp.asarray(x), layout.replicated)
        return jax.make_array_from_process_local_data(layout.batch, np.asarray(x))
    return jax.tree_util.tree_map(place, data)


def per_process(draw: Callable, data: tuple, key: jax.Array, processes: int,
                batch_size: int, n: int) -> tuple:
    """Rows drawn as `processes` equal shares, share p drawn by `draw(block, key_p,
    share, rows)` from process p's rows (`block`), concatenated in process order (a
    global batch; or, for `shuffle="once"`, each process's rows permuted in place)."""
    if processes == 1:
        return draw(data, key, batch_size, n)
    share, rows = batch_size // processes, n // processes
    blocks = jax.tree_util.tree_map(lambda x: x.reshape((processes, rows) + x.shape[1:]), data)
    keys = jax.vmap(lambda p: jax.random.fold_in(key, p))(jnp.arange(processes))
    drawn = jax.vmap(lambda b, k: draw(b, k, share, rows))(blocks, keys)
    return jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), drawn)


def check_batch(batch_size: int | None, layout: DataParallel) -> None:
    if batch_size and batch_size % layout.processes:
        raise ValueError(f"gv.fit(shard=True): batch_size={batch_size} is the global batch, "
                         f"drawn as equal shares from {layout.processes} processes; make it a "
                         "multiple of the number of processes")


def local(tree: Any, layout: DataParallel) -> Any:
    """Replicated global arrays as this process's copies (ordinary arrays)."""
    if layout.processes == 1:
        return tree
    return jax.tree_util.tree_map(
        lambda a: a.addressable_data(0) if isinstance(a, jax.Array) else a, tree)


def reports(layout: DataParallel) -> bool:
    """Whether this process prints progress (process 0 only)."""
    return layout.processes == 1 or jax.process_index() == 0


def agreement(layout: DataParallel) -> Callable[[int, int], tuple[int, int]] | None:
    """`agree(signal, pace) -> (signal, pace)` at a look of `gv.fit`'s pacer
    (genvi/training/pacing.py): across processes, one small collective: a signal
    received by any process (its number; 0 for none) stops all, at the least pace
    proposed. None for one process, which has no one to agree with.

    Example:
        >>> from genvi.training.distributed import agreement, data_parallel
        >>> agreement(data_parallel(False)) is None
        True
    """
    if layout.processes == 1:
        return None

    def agree(signal: int, pace: int) -> tuple[int, int]:
        from jax.experimental import multihost_utils  # noqa: PLC0415 - only across processes
        views = np.asarray(multihost_utils.process_allgather(
            np.array([signal, pace], np.int64))).reshape(-1, 2)
        return int(views[:, 0].max()), int(views[:, 1].min())
    return agree
