"""NeMo RL's package-level data names, ``nemo_rl.data.DataConfig`` and
``nemo_rl.data.datasets.AllTaskProcessedDataset``, resolve here without the package itself
loading torch (the config check imports it)."""

import subprocess
import sys

from nemo_rl_core.data.config import DataConfig
from nemo_rl_core.data.datasets.processed_dataset import AllTaskProcessedDataset


def test_the_names_resolve_to_the_classes_the_flows_use() -> None:
    import nemo_rl_core.data
    import nemo_rl_core.data.datasets

    assert nemo_rl_core.data.DataConfig is DataConfig
    assert nemo_rl_core.data.datasets.AllTaskProcessedDataset is AllTaskProcessedDataset


def test_importing_the_data_config_by_its_nemo_rl_path_loads_no_torch() -> None:
    code = "import sys\nfrom nemo_rl_core.data import DataConfig\nprint('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
