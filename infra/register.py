"""Register what flows need on the local stack: the S3 bucket and the Prefect S3 blocks,
among them the one that holds the parameters of background task runs (the stages that
``cluster.placement`` puts on pools of stage workers), which every machine reaches.

Run by ``infra/stack.sh start`` with ``.infra/env.sh`` in the environment, while the
server is still booting (its imports overlap the server's start), so it first waits for
the API and the S3 endpoint. Every step is idempotent. The bucket is made again on each
start because moto keeps objects in memory only. The stack's own work pool is its
worker's to make (``prefect worker start --type process``), which avoids two creators
racing.
"""

import os
import time
import urllib.request

import boto3
from botocore.exceptions import ClientError
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


def save_s3_blocks(
    endpoint_url: str,
    bucket: str,
    credentials_name: str,
    bucket_name: str,
    task_scheduling_name: str,
) -> None:
    """Save an ``AwsCredentials`` block pointing at the endpoint, an ``S3Bucket`` using it,
    and an ``S3Bucket`` of its ``prefect-task-scheduling/`` folder, Prefect's
    ``PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK`` (``env.sh``)."""
    credentials = AwsCredentials(
        aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        region_name=os.environ["AWS_DEFAULT_REGION"],
        aws_client_parameters=AwsClientParameters(endpoint_url=endpoint_url),
    )
    credentials.save(credentials_name, overwrite=True)
    S3Bucket(bucket_name=bucket, credentials=credentials).save(bucket_name, overwrite=True)
    S3Bucket(
        bucket_name=bucket, credentials=credentials, bucket_folder="prefect-task-scheduling"
    ).save(task_scheduling_name, overwrite=True)


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
        os.environ["NEMO_RL_TASK_SCHEDULING_BLOCK"],
    )
    print(f"registered bucket {bucket} and S3 blocks")


if __name__ == "__main__":
    main()
