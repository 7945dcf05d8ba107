"""Register what flows need on the local stack: the S3 bucket, the Prefect S3 blocks and
the stage work pools (``NEMO_RL_STAGE_POOLS``) that ``cluster.placement`` puts stages on.

Run by ``infra/stack.sh start`` with ``.infra/env.sh`` in the environment, while the
server is still booting (its imports overlap the server's start), so it first waits for
the API and the S3 endpoint. Every step is idempotent. The bucket is made again on each
start because moto keeps objects in memory only. The stack's own work pool is its
worker's to make (``prefect worker start --type process``), which avoids two creators
racing; the stage pools are made here, before any of their workers, because
``prefect deploy`` refuses a deployment on a pool that does not exist.
"""

import os
import time
import urllib.request

import boto3
from botocore.exceptions import ClientError
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.workers.process import ProcessWorker
from prefect_aws import AwsClientParameters, AwsCredentials, S3Bucket


def wait_for_url(url: str, timeout_s: float) -> None:
    """Poll ``url`` until it answers HTTP (any status) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError as err:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s: {err}") from err
            time.sleep(0.2)


def ensure_bucket(endpoint_url: str, bucket: str) -> None:
    """Create ``bucket`` on the S3 endpoint unless it exists."""
    s3 = boto3.client("s3", endpoint_url=endpoint_url)
    try:
        s3.create_bucket(Bucket=bucket)
    except ClientError as err:
        if err.response["Error"]["Code"] != "BucketAlreadyOwnedByYou":
            raise


def save_s3_blocks(endpoint_url: str, bucket: str, credentials_name: str, bucket_name: str) -> None:
    """Save an ``AwsCredentials`` block pointing at the endpoint and an ``S3Bucket`` using it."""
    credentials = AwsCredentials(
        aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        region_name=os.environ["AWS_DEFAULT_REGION"],
        aws_client_parameters=AwsClientParameters(endpoint_url=endpoint_url),
    )
    credentials.save(credentials_name, overwrite=True)
    S3Bucket(bucket_name=bucket, credentials=credentials).save(bucket_name, overwrite=True)


def ensure_process_pools(names: list[str]) -> None:
    """Create each ``process`` work pool that does not exist yet."""
    with get_client(sync_client=True) as client:
        existing = {pool.name for pool in client.read_work_pools()}
        for name in names:
            if name not in existing:
                template = ProcessWorker.get_default_base_job_template()
                client.create_work_pool(
                    WorkPoolCreate(name=name, type="process", base_job_template=template)
                )


def main() -> None:
    endpoint_url = os.environ["NEMO_RL_S3_ENDPOINT_URL"]
    bucket = os.environ["NEMO_RL_S3_BUCKET"]
    timeout_s = float(os.environ.get("INFRA_START_TIMEOUT", "120"))
    wait_for_url(f"{endpoint_url}/moto-api/", timeout_s)
    wait_for_url(f"{os.environ['PREFECT_API_URL']}/health", timeout_s)
    ensure_bucket(endpoint_url, bucket)
    save_s3_blocks(
        endpoint_url,
        bucket,
        os.environ["NEMO_RL_S3_CREDENTIALS_BLOCK"],
        os.environ["NEMO_RL_S3_BUCKET_BLOCK"],
    )
    pools = os.environ.get("NEMO_RL_STAGE_POOLS", "").split()
    ensure_process_pools(pools)
    print(f"registered bucket {bucket}, S3 blocks and stage work pools {pools}")


if __name__ == "__main__":
    main()
