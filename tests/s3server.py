"""A real S3 server for tests: moto's standalone server on 127.0.0.1, with credentials that
are checked (moto's IAM authentication on), and helpers to fill and read its buckets."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import boto3
import httpx
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
# Requests moto serves before checking credentials: the three that make the test user.
_SETUP_ACTIONS = 3
_ALLOW_ALL = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str

    def client(self, access_key: str | None = None, secret_key: str | None = None) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=access_key or self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
            region_name=REGION,
        )

    def connection(self, **changes: str) -> dict[str, str]:
        """A data store ``connection`` in FfDL's field names."""
        fields = {
            "auth_url": self.endpoint,
            "user_name": self.access_key,
            "password": self.secret_key,
            "region": REGION,
        }
        fields.update(changes)
        return fields

    def make_bucket(self, name: str, files: dict[str, bytes] | None = None) -> None:
        client = self.client()
        client.create_bucket(Bucket=name)
        for key, data in (files or {}).items():
            client.put_object(Bucket=name, Key=key, Body=data)

    def buckets(self) -> set[str]:
        return {bucket["Name"] for bucket in self.client().list_buckets()["Buckets"]}

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix`` with its content, keys as stored."""
        client = self.client()
        found: dict[str, bytes] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                found[item["Key"]] = client.get_object(Bucket=bucket, Key=item["Key"])[
                    "Body"
                ].read()
        return found


@contextlib.contextmanager
def s3_server(*, authenticate: bool = True) -> Iterator[S3Server]:
    """Run moto's S3 server on 127.0.0.1 for the block. With ``authenticate`` (the default)
    only the yielded credentials are accepted, as by a real store."""
    # The server's request log would fill every test's captured output.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    endpoint = f"http://127.0.0.1:{port}"
    assert urlsplit(endpoint).hostname == "127.0.0.1"
    try:
        httpx.post(f"{endpoint}/moto-api/reset", timeout=10).raise_for_status()
        access_key, secret_key = "AKIATESTTESTTEST0000", "moto-anything-goes"
        if authenticate:
            httpx.post(
                f"{endpoint}/moto-api/reset-auth", content=str(_SETUP_ACTIONS), timeout=10
            ).raise_for_status()
            iam = boto3.client(
                "iam",
                endpoint_url=endpoint,
                aws_access_key_id="setup",
                aws_secret_access_key="setup",
                region_name=REGION,
            )
            iam.create_user(UserName="ffdl-test")
            key = iam.create_access_key(UserName="ffdl-test")["AccessKey"]
            iam.put_user_policy(
                UserName="ffdl-test", PolicyName="all", PolicyDocument=json.dumps(_ALLOW_ALL)
            )
            access_key, secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        yield S3Server(endpoint=endpoint, access_key=access_key, secret_key=secret_key)
    finally:
        if authenticate:
            with contextlib.suppress(httpx.HTTPError):
                # Back to moto's default for whoever runs a server in this process next.
                httpx.post(f"{endpoint}/moto-api/reset-auth", content=b"inf", timeout=10)
        moto.stop()
