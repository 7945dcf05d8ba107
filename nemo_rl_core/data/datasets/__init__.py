"""NeMo RL's dataset API at its package path (``nemo_rl.data.datasets``), each name loaded on
first use: the datasets need Hugging Face ``datasets`` and torch, the config check neither."""

from nemo_rl_core.utils.lazy_exports import lazy_exports

__getattr__ = lazy_exports(
    __name__,
    {
        "AllTaskProcessedDataset": ".processed_dataset",
        "load_eval_dataset": ".eval_datasets",
        "load_response_dataset": ".response_datasets",
        "load_preference_dataset": ".preference_datasets",
        "assert_no_double_bos": ".utils",
        "extract_necessary_env_names": ".utils",
        "merge_datasets": ".utils",
        "update_single_dataset_config": ".utils",
    },
)
