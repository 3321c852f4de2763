"""Rule influence_store_eigen: the projected curvature of a checkpoint's gradient store (each
layer's projected Gauss-Newton matrix, or EK-FAC in the projected space, from the shards' sums),
eigendecomposed once for every scoring of the store; damped when scored.

By hand, from the run's working directory:
    python scripts/influence_store_eigen.py run=digits_noisy index=0 epoch=0075 method=logra
"""

import time

from _helpers import run_script

from epochlens.influence.projected_basis import store_curvature
from epochlens.runner import log


def main(snakemake) -> None:
    precondition = snakemake.params.config["settings"]["projection"]["precondition"]
    t0 = time.perf_counter()
    basis = store_curvature(list(snakemake.input.infos), precondition)
    log.info(
        "projected curvature (%s) of %d layers: %.1f s",
        precondition,
        len(basis.layers),
        time.perf_counter() - t0,
    )
    basis.save(snakemake.output.curvature)


if __name__ == "__main__":
    run_script(main, "influence_store_eigen", globals().get("snakemake"))
