"""pandas without pyarrow: imported first by the light jobs (the table and figure rules).

pandas 3 imports pyarrow at import time whenever it is installed (for its ``str`` dtype): about
37 MB of a light job's peak memory of 130 to 260 MB. These jobs read and write CSV files and never
need it. With pyarrow kept out, pandas stores strings as Python objects (``str`` dtype, python
storage), exactly as in the figure rules' conda environment (``envs/plots.yaml``), which has no
pyarrow: the same values, the same CSV bytes.

``import pyarrow`` then fails as if it were not installed, and ``pyarrow`` stays out of
``sys.modules`` (scikit-learn, for one, looks there to tell pyarrow arrays apart). Nothing is done
where pandas or pyarrow is already imported.
"""

import sys
from importlib.abc import MetaPathFinder


class _NoPyarrow(MetaPathFinder):
    """A finder that reports pyarrow (and its submodules) as not installed."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "pyarrow" or fullname.startswith("pyarrow."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (kept out: {__name__})", name=fullname)
        return None


if "pandas" not in sys.modules and "pyarrow" not in sys.modules:
    sys.meta_path.insert(0, _NoPyarrow())
