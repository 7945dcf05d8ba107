"""Stage outputs on storage: the Arrow codec for ``BatchedDataDict`` (``codec``) in two file
containers, Arrow IPC and Parquet (``containers``), and the run layout with manifests,
checkpoints and the lease (``run_storage``)."""
