"""The credentials block is read once per process and flow run (flows.storage_block): a
stage worker's task runs of one flow run reuse it, a changed block reaches the next flow
run, and a different block name is read at once."""

from prefect import flow
from prefect_aws import AwsCredentials

from flows.storage_block import load_storage_block
from nemo_rl_core.storage.handles import RunRef, open_storage

ROOT = "s3://block-cache-test"


def save_block(name: str, key_id: str) -> None:
    AwsCredentials(
        aws_access_key_id=key_id,
        aws_secret_access_key="not-a-real-secret",
        aws_client_parameters={"endpoint_url": "http://127.0.0.1:9"},
    ).save(name, overwrite=True)


def key_in_use(block_name: str) -> str:
    """The access key id the run's storage uses after loading ``block_name``."""
    load_storage_block(ROOT, block_name)
    return open_storage(RunRef(ROOT, "cache-test")).fs.key


@flow
def keys_in_a_flow_run(block_name: str) -> list[str]:
    """The key in use, loading the block twice in one flow run, changing it in between."""
    first = key_in_use(block_name)
    save_block(block_name, "AKIACHANGEDINRUN")
    return [first, key_in_use(block_name)]


def test_a_block_is_read_once_per_flow_run_and_again_by_the_next() -> None:
    save_block("cache-a", "AKIAFIRSTKEY0000")
    assert keys_in_a_flow_run("cache-a") == ["AKIAFIRSTKEY0000", "AKIAFIRSTKEY0000"]
    # the next flow run reads the block as the server holds it now
    assert keys_in_a_flow_run("cache-a") == ["AKIACHANGEDINRUN", "AKIACHANGEDINRUN"]


def test_a_different_block_name_is_read_at_once() -> None:
    save_block("cache-b", "AKIABLOCKBKEY000")
    save_block("cache-c", "AKIABLOCKCKEY000")
    assert key_in_use("cache-b") == "AKIABLOCKBKEY000"
    assert key_in_use("cache-c") == "AKIABLOCKCKEY000"
    assert key_in_use("cache-b") == "AKIABLOCKBKEY000"
