"""Storage credentials from a Prefect block: a flow or stage worker given the name of a
prefect-aws ``AwsCredentials`` block uses its keys and endpoint for the run's ``s3://`` root."""

from nemo_rl_core.storage.handles import use_storage_options


def load_storage_block(storage_root: str, block_name: str | None) -> None:
    """Use the credentials of a prefect-aws ``AwsCredentials`` block for ``storage_root``."""
    if block_name is None:
        return
    from prefect_aws import AwsCredentials

    # Prefect's async_dispatch types every call as R | Coroutine; from sync code it is R.
    credentials: AwsCredentials = AwsCredentials.load(block_name)  # type: ignore[assignment]
    secret = credentials.aws_secret_access_key
    options: dict = {
        "key": credentials.aws_access_key_id,
        "secret": secret.get_secret_value() if secret is not None else None,
    }
    endpoint = credentials.aws_client_parameters.endpoint_url
    if endpoint:
        options["client_kwargs"] = {"endpoint_url": endpoint}
    use_storage_options(storage_root, options)
