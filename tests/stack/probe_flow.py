"""A test-only flow that exercises what real flows need from the stack.

It is deployed from a temporary project by the stack tests (not collected by pytest):
it loads the S3 blocks registered by ``infra/stack.sh``, writes an object through them,
reads it back with s3fs using only the environment the worker passes on, and logs
the credentials block so a test can prove the secret stays masked.
"""

import time

import s3fs
from prefect import flow, get_run_logger
from prefect_aws import AwsCredentials, S3Bucket


@flow(name="stack-probe", log_prints=True)
def stack_probe(
    message: str, key: str, bucket_block: str, credentials_block: str, hold_seconds: float = 0
) -> str:
    """Write ``message`` to ``key`` through the S3Bucket block, read it back through s3fs,
    then stay running ``hold_seconds`` (a stand-in for a long stage)."""
    logger = get_run_logger()
    credentials = AwsCredentials.load(credentials_block)
    # The block's repr is what careless code would log; it must not show the secret.
    logger.info("credentials block %s: %r", credentials_block, credentials)
    print(f"credentials fields: {credentials.model_dump()}")
    bucket = S3Bucket.load(bucket_block)
    bucket.write_path(key, message.encode())
    # s3fs with no explicit settings: the endpoint and keys come from the worker's env.
    fs = s3fs.S3FileSystem()
    read_back = fs.cat_file(f"{bucket.bucket_name}/{key}").decode()
    if read_back != message:
        raise RuntimeError(f"read back {read_back!r} from {key}, wrote {message!r}")
    logger.info("wrote and read back s3://%s/%s", bucket.bucket_name, key)
    time.sleep(hold_seconds)
    return read_back
