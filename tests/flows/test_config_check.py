"""Mistakes fail fast and clearly (issue 19): each kind is refused by ``python -m flows.grpo``
in one line naming the key or file, with a nonzero exit, before anything is written, and
before torch, transformers, vLLM or Prefect load (the deterministic form of "within 5 s":
those imports alone take longer). A config runs from another working directory."""

from pathlib import Path

import pytest
from python_forks import PythonForks

from flows.config_check import check_run_config
from nemo_rl_core.algorithms.grpo_config import MasterConfig
from nemo_rl_core.utils.config import ConfigError
from nemo_rl_core.utils.cuda_devices import _listed_devices

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "examples" / "configs"
# The command line as ``python -m flows.grpo`` runs it, in a process of its own.
GRPO_COMMAND = "import runpy\nrunpy.run_module('flows.grpo', run_name='__main__', alter_sys=True)"
MISSING = "/nonexistent/nemo-rl-core"
TYPO_YAML = f"defaults: {CONFIGS / 'grpo_math_tiny.yaml'}\ngrpo:\n  num_prompts_per_stepp: 2\n"


def refuse(
    forks: PythonForks, args: list[str], cwd: Path, out: Path, hidden: str = ""
) -> tuple[int, list[str], list[str]]:
    """Exit code, stderr lines and the heavy packages loaded of one refused command; the
    packages in ``hidden`` are absent (tests/python_forks.py)."""
    outputs = [f"checkpointing.checkpoint_dir={out}/results", f"logger.log_dir={out}/logs"]
    done = forks.run(GRPO_COMMAND, [*args, *outputs], cwd=cwd, hidden=hidden.split())
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return done.returncode, lines, done.heavy


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--config", "typo.yaml"], "grpo.num_prompts_per_stepp: unknown key"),
        (["grpo.num_prompts_per_stepp=2"], "grpo.num_prompts_per_stepp"),
        (["policy.train_micro_batch_size=abc"], "policy.train_micro_batch_size"),
        (["--config", f"{MISSING}/grpo.yaml"], f"{MISSING}/grpo.yaml"),
        (
            ["data.train.dataset_name=ResponseDataset", f"+data.train.data_path={MISSING}.jsonl"],
            f"{MISSING}.jsonl",
        ),
        (["data.default.prompt_file=no_such_prompt.txt"], "no_such_prompt.txt"),
        (["data.default.env_name=maths"], "data.train.env_name: 'maths'"),
        (["policy.model_name=no-such-model"], "policy.model_name: model 'no-such-model'"),
        (
            ["policy.generation.backend=vllm", "policy.generation.vllm_cfg.tensor_parallel_size=4"],
            "policy.generation.vllm_cfg.tensor_parallel_size=4",
        ),
        (["grpo.calculate_advantages_on_gpu=true"], "grpo.calculate_advantages_on_gpu=True"),
        (["logger.swanlab_enabled=true"], "logger.swanlab_enabled=True"),
        (
            ["grpo.async_grpo.max_trajectory_age_steps=0"],
            "grpo.async_grpo.max_trajectory_age_steps: Value error, is 0: a trajectory is at "
            "least one step old",
        ),
        (
            ["grpo.async_grpo.enabled=true"],
            "loss_fn.use_importance_sampling_correction: must be true with grpo.async_grpo.enabled",
        ),
        (
            [
                "grpo.async_grpo.enabled=true",
                "loss_fn.use_importance_sampling_correction=true",
                "grpo.use_dynamic_sampling=true",
            ],
            "grpo.use_dynamic_sampling: not supported with grpo.async_grpo.enabled",
        ),
        (
            [
                "grpo.async_grpo.enabled=true",
                "loss_fn.use_importance_sampling_correction=true",
                "grpo.async_grpo.in_flight_weight_updates=true",
            ],
            "grpo.async_grpo.in_flight_weight_updates=True: each generated batch comes from "
            "one recorded weights version",
        ),
    ],
    ids=[
        "unknown-key-in-yaml",
        "unknown-key-override",
        "wrong-type",
        "missing-config",
        "missing-data-file",
        "missing-prompt-file",
        "unknown-environment",
        "unknown-model",
        "backend-needs-gpus",
        "gpu-advantages",
        "logger-package-missing",
        "async-age-below-one",
        "async-without-importance-sampling",
        "async-with-dynamic-sampling",
        "async-in-flight-updates",
    ],
)
def test_mistake_is_refused_fast_in_one_line(
    args: list[str], named: str, tmp_path: Path, python_forks: PythonForks
) -> None:
    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    (cwd / "typo.yaml").write_text(TYPO_YAML)
    if "--config" not in args:
        args = ["--config", str(CONFIGS / "grpo_math_tiny.yaml"), *args]
    code, lines, loaded = refuse(python_forks, args, cwd, out)
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert named in lines[0]
    assert sorted(p.name for p in cwd.iterdir()) == ["typo.yaml"], "wrote into the working dir"
    assert not out.exists(), "created the run's storage or log folder"
    assert loaded == [], f"loaded {loaded} before refusing"


@pytest.mark.parametrize("logger", ["wandb", "tensorboard", "mlflow"])
def test_a_logger_whose_package_is_missing_is_refused(
    logger: str, tmp_path: Path, python_forks: PythonForks
) -> None:
    config = ["--config", str(CONFIGS / "grpo_math_tiny.yaml")]
    code, lines, loaded = refuse(
        python_forks,
        [*config, f"logger.{logger}_enabled=true"],
        tmp_path,
        tmp_path / "out",
        hidden=logger,
    )
    assert code == 2 and len(lines) == 1, lines
    assert f"logger.{logger}_enabled=True: " in lines[0] and f"the {logger} package" in lines[0]
    assert loaded == [] and not (tmp_path / "out").exists()


def test_a_mistake_torch_must_check_is_still_refused_before_the_run(
    tmp_path: Path, python_forks: PythonForks
) -> None:
    """The optimizer's kwargs are checked against torch's class, last, in one line."""
    code, lines, loaded = refuse(
        python_forks,
        ["--config", str(CONFIGS / "grpo_math_tiny.yaml"), "+policy.optimizer.kwargs.lrr=1"],
        tmp_path,
        tmp_path / "out",
    )
    assert code == 2 and len(lines) == 1, lines
    assert "policy.optimizer: kwargs ['lrr'] are not parameters of" in lines[0]
    assert "prefect" not in loaded and not (tmp_path / "out").exists()


def test_a_config_runs_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``defaults:`` and the prompt file resolve from the config file, not the working
    directory; the stored config names the file it read."""
    monkeypatch.chdir(tmp_path)
    config = check_run_config(MasterConfig, str(CONFIGS / "grpo_addition_tiny.yaml"), [])
    assert config.policy.model_name == "tiny-llama-arith"
    assert config.grpo.num_prompts_per_step == 16
    config = check_run_config(MasterConfig, str(CONFIGS / "grpo_math_tiny.yaml"), [])
    assert config.data.train[0].prompt_file == str(REPO / "examples" / "prompts" / "math_cot.txt")
    assert list(tmp_path.iterdir()) == []


def test_input_files_resolve_from_the_config_then_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Next to the config first (as ``defaults:``); else from the working directory (NeMo
    RL's own configs name files from its repository root)."""
    configs, cwd = tmp_path / "configs", tmp_path / "cwd"
    configs.mkdir()
    cwd.mkdir()
    (configs / "rows.jsonl").write_text('{"input": "1+1?", "output": "2"}\n')
    (cwd / "prompt.txt").write_text("Answer: {}\n")
    config = configs / "run.yaml"
    config.write_text(f"defaults: {CONFIGS / 'grpo_math_tiny.yaml'}\n")
    monkeypatch.chdir(cwd)
    overrides = [
        "data.train.dataset_name=ResponseDataset",
        "+data.train.data_path=rows.jsonl",
        "data.default.prompt_file=prompt.txt",
    ]
    loaded = check_run_config(MasterConfig, str(config), overrides)
    assert loaded.data.train[0].data_path == str(configs / "rows.jsonl")
    assert loaded.data.train[0].prompt_file == str(cwd / "prompt.txt")
    with pytest.raises(ConfigError, match="data.train.env_name: 'maths'"):
        check_run_config(MasterConfig, str(config), [*overrides, "+data.train.env_name=maths"])


@pytest.mark.parametrize(
    ("visible", "count"), [("0,1", 2), ("", 0), ("-1", 0), ("0,-1,2", 1), ("GPU-a1b2", 1)]
)
def test_cuda_visible_devices_is_read_as_cuda_reads_it(visible: str, count: int) -> None:
    assert _listed_devices(visible) == count


def test_async_training_under_ppo_is_refused_by_name() -> None:
    from nemo_rl_core.algorithms.ppo import PPOMasterConfig

    with pytest.raises(ConfigError, match="ppo: Value error, async_grpo: asynchronous training"):
        check_run_config(
            PPOMasterConfig, str(CONFIGS / "ppo_tiny.yaml"), ["++ppo.async_grpo.enabled=true"]
        )


def test_an_environment_no_dataset_names_is_not_read_and_the_log_says_so() -> None:
    """NeMo RL builds only the environments its datasets name: a section of another name
    (a typo included) runs there unread, and here too, said once in the log."""
    from flows.run_setup import config_notes

    config = check_run_config(
        MasterConfig, str(CONFIGS / "grpo_math_tiny.yaml"), ["+env.maths.num_workers=1"]
    )
    assert any(note.startswith("env.maths: not read") for note in config_notes(config))
