"""Stage outputs on storage: the Parquet codec for ``BatchedDataDict`` (``codec``) and the
run layout with manifests, checkpoints and the lease (``run_storage``)."""
