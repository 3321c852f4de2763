"""Rule lds_tables: the linear datamodeling score of each influence method of a run
(tables/lds.csv) and each query's correlation (tables/lds_queries.csv); see epochlens.study.lds.

By hand, from the run's working directory: python scripts/lds_tables.py run=digits_noisy
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
from _helpers import run_script

from epochlens.atomic import write_atomic
from epochlens.runner import log
from epochlens.study.lds import lds_tables


def main(snakemake) -> None:
    inp, out, p = snakemake.input, snakemake.output, snakemake.params
    n = p.lds["parts"]  # the retraining parts of each (index, epoch), in p.checkpoints' order
    parts = {(int(i), int(e)): list(inp.parts[k * n : (k + 1) * n]) for k, (i, e) in enumerate(p.checkpoints)}
    tables = lds_tables(p.jobs, list(inp.scores), parts, p.lds["fraction"], p.lds["bootstrap"], p.lds["seed"])
    write_atomic(out.lds, lambda path: tables["lds"].to_csv(path, index=False))
    write_atomic(out.queries, lambda path: tables["queries"].to_csv(path, index=False))
    log.info("linear datamodeling score:\n%s", tables["lds"].to_string(index=False))


if __name__ == "__main__":
    run_script(main, "lds_tables", globals().get("snakemake"))
