#!/usr/bin/env python3
"""Independent S3 oracle for the integration tests: boto3, unrelated to
Sluice's own S3 client, reads and writes the gateway directly.

usage: s3_oracle.py ENDPOINT ACCESS_KEY SECRET_KEY sha256 BUCKET KEY
       s3_oracle.py ENDPOINT ACCESS_KEY SECRET_KEY rdma-get BUCKET KEY TOKEN
       s3_oracle.py ENDPOINT ACCESS_KEY SECRET_KEY rdma-put BUCKET KEY TOKEN
       s3_oracle.py ENDPOINT ACCESS_KEY SECRET_KEY put BUCKET KEY FILE
       s3_oracle.py ENDPOINT ACCESS_KEY SECRET_KEY count BUCKET PREFIX
       s3_oracle.py ENDPOINT ACCESS_KEY SECRET_KEY exists BUCKET KEY
       s3_oracle.py ENDPOINT ACCESS_KEY SECRET_KEY uploads BUCKET PREFIX
"""
import hashlib
import json
import sys

import boto3
from botocore.config import Config


def main() -> int:
    endpoint, ak, sk, cmd, bucket, key, *rest = sys.argv[1:]
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ak,
        aws_secret_access_key=sk,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                      request_checksum_calculation="when_required",
                      response_checksum_validation="when_required"),
    )
    if cmd == "sha256":
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        print(hashlib.sha256(body).hexdigest(), len(body))
    elif cmd == "put":
        with open(rest[0], "rb") as f:
            s3.put_object(Bucket=bucket, Key=key, Body=f.read())
        print("ok")
    elif cmd in ("rdma-get", "rdma-put"):
        # A third-party client's view of S3 over RDMA: the token (and the
        # tcp-transport marker) are added in a before-sign hook, so they are
        # part of the SigV4 signature like any other header.
        token = rest[0]

        def add_token(request, **_):
            request.headers["x-amz-rdma-token"] = token
            request.headers["x-sluice-rdma-transport"] = "tcp"

        op = "GetObject" if cmd == "rdma-get" else "PutObject"
        s3.meta.events.register(f"before-sign.s3.{op}", add_token)
        if cmd == "rdma-get":
            resp = s3.get_object(Bucket=bucket, Key=key)
            body_len = len(resp["Body"].read())
        else:
            resp = s3.put_object(Bucket=bucket, Key=key, Body=b"")
            body_len = 0
        h = resp["ResponseMetadata"]["HTTPHeaders"]
        print(json.dumps({
            "status": resp["ResponseMetadata"]["HTTPStatusCode"],
            "reply": h.get("x-amz-rdma-reply"),
            "bytes": h.get("x-amz-rdma-bytes-transferred"),
            "body_len": body_len,
        }))
    elif cmd == "copy":
        # copy BUCKET KEY DEST_KEY: server-side copy, metadata included.
        s3.copy_object(Bucket=bucket, Key=rest[0], CopySource={"Bucket": bucket, "Key": key})
        print("ok")
    elif cmd == "exists":
        try:
            s3.head_object(Bucket=bucket, Key=key)
            print("yes")
        except s3.exceptions.ClientError as e:
            if e.response["Error"]["Code"] not in ("404", "NoSuchKey", "NotFound"):
                raise
            print("no")
    elif cmd == "count":
        n = 0
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            n += len(page.get("Contents", []))
        print(n)
    elif cmd == "uploads":
        # uploads BUCKET PREFIX: multipart uploads in progress under PREFIX.
        print(len(s3.list_multipart_uploads(Bucket=bucket, Prefix=key).get("Uploads", [])))
    else:
        print(f"unknown command {cmd}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
