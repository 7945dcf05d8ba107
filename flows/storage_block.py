"""Storage credentials from a Prefect block: a flow or stage worker given the name of a
prefect-aws ``AwsCredentials`` block uses its keys and endpoint for the run's ``s3://`` root.

A block is read once per process and flow run (outside a flow run, once per process): a
stage worker runs many task runs of one flow run, and reading the block for each cost an API
round trip and the block's parsing (tens of ms on a loaded 2-core machine, bench/RESULTS.md,
issue 30). A block changed on the server is read again by the next flow run, as a changed
config is (``flows.pool_tasks`` keeps a warm runtime per flow run too); a different block
name is read at once."""

from typing import Any

from prefect.context import FlowRunContext

from nemo_rl_core.storage.handles import use_storage_options

# block name -> (the flow run it was read for, the fsspec options it gave)
_read: dict[str, tuple[str | None, dict[str, Any]]] = {}


def load_storage_block(storage_root: str, block_name: str | None) -> None:
    """Use the credentials of a prefect-aws ``AwsCredentials`` block for ``storage_root``."""
    if block_name is None:
        return
    context = FlowRunContext.get()
    flow_run = str(context.flow_run.id) if context is not None and context.flow_run else None
    held = _read.get(block_name)
    if held is None or held[0] != flow_run:
        held = _read[block_name] = (flow_run, storage_options_of(block_name))
    use_storage_options(storage_root, dict(held[1]))


def storage_options_of(block_name: str) -> dict[str, Any]:
    """fsspec options (keys, endpoint) from the ``AwsCredentials`` block ``block_name``."""
    from prefect_aws import AwsCredentials

    # Prefect's async_dispatch types every call as R | Coroutine; from sync code it is R.
    credentials: AwsCredentials = AwsCredentials.load(block_name)  # type: ignore[assignment]
    secret = credentials.aws_secret_access_key
    options: dict[str, Any] = {
        "key": credentials.aws_access_key_id,
        "secret": secret.get_secret_value() if secret is not None else None,
    }
    endpoint = credentials.aws_client_parameters.endpoint_url
    if endpoint:
        options["client_kwargs"] = {"endpoint_url": endpoint}
    return options
