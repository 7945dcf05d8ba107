"""The run logger: one folder per run, the run id in every record, and each backend's output
read back with that tool's own reader (TensorBoard's EventAccumulator, MLflow's
search_runs, the W&B offline run file)."""

import json
import math
import struct
from pathlib import Path

import psutil
import pytest
from pydantic import BaseModel

from nemo_rl_core.utils.gpu_monitor import GpuMonitor, host_memory, parse_nvidia_smi
from nemo_rl_core.utils.key_support import (
    Machine,
    UnsupportedConfigError,
    Wired,
    check_support,
    resolve_reader,
)
from nemo_rl_core.utils.key_support import declared_keys as walk_keys
from nemo_rl_core.utils.logger import Logger, LoggerConfig, flatten_dict, get_next_experiment_dir

RUN = "grpo-test-run"
STEPS = {1: {"loss": 0.5, "kl_penalty": 0.01}, 2: {"loss": 0.25, "kl_penalty": 0.02}}


def log_two_steps(config: LoggerConfig, run_id: str = RUN) -> Logger:
    logger = Logger(config, run_id)
    logger.log_hyperparams({"grpo": {"num_prompts_per_step": 4}, "loss_fn": {"kl": 0.01}})
    for step, metrics in STEPS.items():
        logger.log_metrics(metrics, step, prefix="train")
    logger.close()
    return logger


def test_jsonl_records_carry_the_run_id_in_the_runs_own_folder(tmp_path):
    config = LoggerConfig(log_dir=str(tmp_path))
    log_two_steps(config)
    Logger(config, "other-run").close()
    lines = (tmp_path / RUN / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert records == [
        {"run_id": RUN, "step": 1, "train/loss": 0.5, "train/kl_penalty": 0.01},
        {"run_id": RUN, "step": 2, "train/loss": 0.25, "train/kl_penalty": 0.02},
    ]
    assert not (tmp_path / "other-run" / "metrics.jsonl").exists()  # nothing logged there


def test_a_nemo_rl_script_logs_into_log_dir_from_its_section_as_a_mapping(tmp_path):
    """``Logger(master_config["logger"])``: no run id, the folder is ``log_dir`` itself (a
    NeMo RL runner's ``exp_<n>``), and a misspelt key is refused naming it."""
    log_dir = tmp_path / "exp_3"
    logger = Logger({"log_dir": str(log_dir), "tensorboard_enabled": False})
    logger.log_metrics({"loss": 0.5}, 1, prefix="train")
    logger.close()
    record = json.loads((log_dir / "metrics.jsonl").read_text())
    assert record == {"run_id": "exp_3", "step": 1, "train/loss": 0.5}
    with pytest.raises(ValueError, match="tensorbord_enabled"):
        Logger({"log_dir": str(log_dir), "tensorbord_enabled": True})


def test_each_script_run_gets_the_next_experiment_folder(tmp_path):
    """NeMo RL's runners log into ``get_next_experiment_dir(log_dir)``: exp_001, then one past
    the highest (a gap is not reused)."""
    base = tmp_path / "logs"
    assert get_next_experiment_dir(str(base)) == str(base / "exp_001")
    (base / "exp_007").mkdir()
    (base / "exp_notes").mkdir()
    assert get_next_experiment_dir(str(base)) == str(base / "exp_008")
    assert sorted(p.name for p in base.iterdir()) == ["exp_001", "exp_007", "exp_008", "exp_notes"]


def test_samples_are_dumped_one_line_each_inside_the_log_folder(tmp_path):
    """A NeMo RL loop's ``log_batched_dict_as_jsonl(train_data, f"train_data_step{n}.jsonl")``
    and ``log_string_list_as_jsonl``; a file name leaving the folder is refused."""
    import torch

    from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict

    logger = Logger({"log_dir": str(tmp_path)})
    batch = BatchedDataDict(
        {"input_ids": torch.tensor([[1, 2], [3, 4]]), "content": ["a", "b"], "reward": [0.5, 1]}
    )
    path = logger.log_batched_dict_as_jsonl(batch, "samples/train_data_step3.jsonl")
    assert path == tmp_path / "samples" / "train_data_step3.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [
        {"input_ids": [1, 2], "content": "a", "reward": 0.5, "idx": 0},
        {"input_ids": [3, 4], "content": "b", "reward": 1, "idx": 1},
    ]
    logger.log_batched_dict_as_jsonl({"content": ["c"]}, "samples/train_data_step3.jsonl")
    assert path.read_text() == '{"content": "c", "idx": 0}\n'  # replaced whole

    logger.log_string_list_as_jsonl(["one", "two"], "text.jsonl")
    logger.log_string_list_as_jsonl(["three"], "text.jsonl")
    assert (tmp_path / "text.jsonl").read_text().splitlines() == ["one", "two", "three"]

    with pytest.raises(ValueError, match="not a file inside the log folder"):
        logger.log_string_list_as_jsonl(["x"], "../outside.jsonl")
    with pytest.raises(ValueError, match=r"column sizes \{'a': 2, 'b': 1\}"):
        logger.log_batched_dict_as_jsonl({"a": [1, 2], "b": [1]}, "bad.jsonl")
    assert (
        not (tmp_path / "bad.jsonl").exists() and not (tmp_path.parent / "outside.jsonl").exists()
    )
    logger.close()


def test_flatten_dict_joins_keys_and_expands_lists_by_index():
    nested = {"policy": {"lr": 1e-6, "stop": ["</s>", "\n"]}, "envs": [{"name": "math"}]}
    assert flatten_dict(nested) == {
        "policy.lr": 1e-6,
        "policy.stop.0": "</s>",
        "policy.stop.1": "\n",
        "envs.0.name": "math",
    }
    kept = flatten_dict(nested, sep="/", expand_lists=False)
    assert kept == {"policy/lr": 1e-6, "policy/stop": ["</s>", "\n"], "envs": [{"name": "math"}]}
    assert flatten_dict({"empty": {}, "none": []}) == {}


def test_jsonl_flattens_nested_metrics_and_keeps_non_finite_numbers(tmp_path):
    import torch

    logger = Logger(LoggerConfig(log_dir=str(tmp_path)), RUN)
    logger.log_metrics({"a": {"b": torch.tensor(2.0)}, "c": math.nan, "text": "skipped"}, 3)
    logger.close()
    record = json.loads((tmp_path / RUN / "metrics.jsonl").read_text())
    assert record == {"run_id": RUN, "step": 3, "a/b": 2.0, "c": "nan"}


def test_tensorboard_events_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_two_steps(LoggerConfig(log_dir=str(tmp_path), tensorboard_enabled=True))
    events = EventAccumulator(str(tmp_path / RUN / "tensorboard"))
    events.Reload()
    assert {"train/loss", "train/kl_penalty"} <= set(events.Tags()["scalars"])
    loss = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert loss == [(1, 0.5), (2, 0.25)]


def test_nemo_rl_tensorboard_log_dir_stays_in_the_runs_log_folder(
    nemo_rl_configs, tmp_path, monkeypatch
):
    """NeMo RL's dpo.yaml names logger.tensorboard.log_dir "tb_logs-dpo-dev", which NeMo
    RL's logger never reads: events go to <log_dir>/tensorboard there, to the run's log
    folder's tensorboard/ here, and nothing lands in the working directory."""
    from nemo_rl_examples import validated

    monkeypatch.chdir(tmp_path)
    config = validated(
        nemo_rl_configs / "dpo.yaml",
        ["policy.model_name=tiny-llama", "policy.tokenizer.name=tiny-llama",
         "data.train.dataset_name=addition_preference",
         "data.validation.dataset_name=addition_preference",
         "logger.tensorboard_enabled=true", f"logger.log_dir={tmp_path / 'logs'}"],
    )  # fmt: skip
    assert config.logger.tensorboard.log_dir == "tb_logs-dpo-dev"
    log_two_steps(config.logger)
    assert list((tmp_path / "logs" / RUN / "tensorboard").glob("events.out.tfevents.*"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"]


@pytest.mark.parametrize("store", ["default", "file"])
def test_mlflow_local_store_reads_back_and_a_resume_continues_the_run(tmp_path, store, monkeypatch):
    import mlflow

    uri = f"file:{tmp_path / 'mlruns'}" if store == "file" else None
    mlflow_keys = {"experiment_name": "nemo-rl-test", "tracking_uri": uri}
    config = LoggerConfig(log_dir=str(tmp_path), mlflow_enabled=True, mlflow=mlflow_keys)
    log_two_steps(config)
    resumed = Logger(config, RUN)  # a later flow run of the same run
    resumed.log_metrics({"loss": 0.125}, 3, prefix="train")
    resumed.log_metrics({"pass@4": 0.75}, 3, prefix="validation")
    resumed.close()
    store_uri = uri or f"sqlite:///{tmp_path / RUN / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store_uri)
    found = mlflow.search_runs(experiment_names=["nemo-rl-test"])
    assert len(found) == 1
    run = found.iloc[0]
    assert run["tags.nemo_rl_core.run_id"] == RUN and run["tags.mlflow.runName"] == RUN
    assert run["metrics.train/loss"] == 0.125  # the latest value
    assert run["params.grpo.num_prompts_per_step"] == "4"
    assert run["metrics.validation/pass_4"] == 0.75  # '@' is not allowed in MLflow names
    history = mlflow.MlflowClient(tracking_uri=store_uri)
    steps = [(m.step, m.value) for m in history.get_metric_history(run["run_id"], "train/loss")]
    assert sorted(steps) == [(1, 0.5), (2, 0.25), (3, 0.125)]


def wandb_history(run_file: Path) -> list[dict]:
    """The history rows of a W&B run file (a LevelDB-style log of protobuf records)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    block, header = 32768, 7
    position, pending, rows = header, b"", []
    while position + header <= len(data):
        room = block - position % block
        if room < header:  # a block's tail too short for a record header is padding
            position += room
            continue
        length, kind = struct.unpack_from("<HB", data, position + 4)
        pending += data[position + header : position + header + length]
        position += header + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                items = record.history.item
                rows.append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
                )
    return rows


def test_wandb_offline_run_holds_the_history(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")  # the logger must stay offline regardless
    log_two_steps(LoggerConfig(log_dir=str(tmp_path), wandb_enabled=True))
    # NeMo RL's layout: W&B's dir is <log folder>/wandb, where W&B makes its own wandb/
    run_dirs = list((tmp_path / RUN / "wandb" / "wandb").glob(f"offline-run-*-{RUN}"))
    assert len(run_dirs) == 1
    rows = wandb_history(run_dirs[0] / f"run-{RUN}.wandb")
    losses = [(row["_step"], row["train/loss"]) for row in rows if "train/loss" in row]
    assert losses == [(1, 0.5), (2, 0.25)]


class Root(BaseModel):
    logger: LoggerConfig


CPU_ONLY = Machine(cuda_devices=0)


def refusal(**keys) -> str:
    with pytest.raises(UnsupportedConfigError) as err:
        check_support(Root(logger=LoggerConfig(**keys)), CPU_ONLY)
    return str(err.value)


def test_keys_that_cannot_work_here_are_refused_by_name():
    assert "logger.swanlab_enabled=True: SwanLab logging is not built" in refusal(
        swanlab_enabled=True
    )
    # NeMo RL's configs turn GPU monitoring on; with no GPU there is nothing to sample.
    check_support(Root(logger=LoggerConfig(monitor_gpus=True)), CPU_ONLY)
    server = refusal(mlflow_enabled=True, mlflow={"tracking_uri": "http://localhost:5000"})
    assert "logger.mlflow_enabled=True: logger.mlflow.tracking_uri='http://localhost:5000'" in (
        server
    )
    # The same keys off, as NeMo RL's own configs carry them, pass.
    check_support(
        Root(
            logger=LoggerConfig(
                monitor_gpus=False,
                mlflow={"tracking_uri": "http://localhost:5000", "experiment_name": "x"},
                wandb={"project": "p", "name": "n"},
                swanlab={"project": "p", "name": "n"},
                gpu_monitoring={"collection_interval": 10, "flush_interval": 10},
            )
        ),
        CPU_ONLY,
    )


def test_every_logger_key_carries_a_rule():
    leaves = [key for key in walk_keys(LoggerConfig) if not key.section]
    assert leaves and all(key.rule is not None for key in leaves), [
        key.key for key in leaves if key.rule is None
    ]
    for key in leaves:
        if isinstance(key.rule, Wired):
            assert callable(resolve_reader(key.rule.by)), key.key


def test_nvidia_smi_listing_parses_into_nemo_rl_names():
    listing = "0, 87, 40960\n1, 3, 512\n"
    assert parse_nvidia_smi(listing) == {
        "node.0.gpu.0.util": 87.0,
        "node.0.gpu.0.mem_gb": 40.0,
        "node.0.gpu.1.util": 3.0,
        "node.0.gpu.1.mem_gb": 0.5,
    }


def test_monitor_flushes_its_samples_to_the_logger(tmp_path):
    logger = Logger(LoggerConfig(log_dir=str(tmp_path)), RUN)
    monitor = GpuMonitor(0.01, 0.05, logger.log_metrics, sample=host_memory)
    monitor.start()
    monitor.stop()
    logger.close()
    records = [json.loads(line) for line in (tmp_path / RUN / "metrics.jsonl").open()]
    assert records, "stop() hands over what was sampled"
    total = psutil.virtual_memory().total / 1024**3
    assert all(r["ray/node.0.mem_total_gb"] == pytest.approx(total) for r in records)
    assert all(r["step"] == r["ray/ray_step"] for r in records)
