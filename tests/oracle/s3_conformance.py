#!/usr/bin/env python3
"""S3 behaviour of an S3 server, checked with boto3 (and the AWS CRT client
s3torchconnectorclient, the one PyTorch users load S3 with) as the oracle.

usage: s3_conformance.py ENDPOINT ACCESS_KEY SECRET_KEY BUCKET [SEED]

Prints one line per check, "ok <name>" or "FAIL <name>: <why>", then
"checks=N failed=M keys=K" and exits non-zero if any failed. The bucket
must exist and start empty; the run leaves it empty.
"""
import datetime
import hashlib
import os
import random
import sys
import traceback

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

ENDPOINT, AK, SK, BUCKET = sys.argv[1:5]
SEED = int(sys.argv[5]) if len(sys.argv) > 5 else 1
CFG = dict(s3={"addressing_style": "path"}, retries={"max_attempts": 1})


def client(ak=AK, sk=SK, **extra):
    return boto3.client("s3", endpoint_url=ENDPOINT, aws_access_key_id=ak, aws_secret_access_key=sk,
                        region_name="us-east-1", config=Config(**CFG, **extra))


s3 = client()
results = []


def all_keys(prefix=""):
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix, PaginationConfig={"PageSize": 7}):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys


def empty_bucket():
    keys = all_keys()
    for i in range(0, len(keys), 1000):
        s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True})


def check(fn):
    try:
        empty_bucket()
        fn()
        results.append((fn.__name__, None))
    except Exception as e:  # noqa: BLE001 - every failure is reported
        results.append((fn.__name__, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))
    return fn


def code(fn):
    """The S3 error code (and HTTP status) a call fails with."""
    try:
        fn()
    except ClientError as e:
        return e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"]
    return None, 200


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


# ".." itself is stored on its own below: it is a prefix of "../x".
HOSTILE = ["../x", "../" + BUCKET + "/k", ".", "/abs", "a//b", "a/b", "dir/", "dir/file", "100%", "%2E",
           "a+b", "sp ace", "ü/日本", "x/./y", "x/../y", "tab\tkey", "q?uery#frag", "~tilde", "*star"]


@check
def hostile_keys_are_stored_faithfully():
    bodies = {k: f"body of {k!r}".encode() for k in HOSTILE}
    for k, b in bodies.items():
        s3.put_object(Bucket=BUCKET, Key=k, Body=b)
    for k, b in bodies.items():
        got = s3.get_object(Bucket=BUCKET, Key=k)["Body"].read()
        expect(got == b, f"{k!r} read back {got!r}")
    expect(sorted(all_keys()) == sorted(bodies), f"listing {sorted(all_keys())} != {sorted(bodies)}")
    s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in bodies], "Quiet": True})
    expect(all_keys() == [], f"left after delete: {all_keys()}")
    s3.put_object(Bucket=BUCKET, Key="..", Body=b"dot dot")
    expect(s3.get_object(Bucket=BUCKET, Key="..")["Body"].read() == b"dot dot", "'..' read back")
    expect(all_keys() == [".."], f"{all_keys()}")
    s3.delete_object(Bucket=BUCKET, Key="..")


@check
def missing_keys_are_no_such_key_not_errors():
    for k in ["..", ".", "/abs", "nope/..", "a" * 300]:
        c = code(lambda: s3.get_object(Bucket=BUCKET, Key=k))
        expect(c[0] in ("NoSuchKey", "KeyTooLongError"), f"GET {k!r}: {c}")


@check
def key_space_fuzz():
    rng = random.Random(SEED)
    alphabet = ["a", "b", "/", ".", "..", "%", "+", " ", "é", "-", "_", "~", "%2E", "//"]
    keys = set()
    while len(keys) < 150:
        k = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))
        keys.add(k)
    stored = {}
    for k in sorted(keys):
        body = hashlib.sha256(k.encode()).digest() * rng.randint(0, 3)
        try:
            s3.put_object(Bucket=BUCKET, Key=k, Body=body)
            stored[k] = body
        except ClientError as e:
            # Refusing is allowed (a key that is an object and a prefix of
            # another), with a clear 4xx and nothing changed.
            st = e.response["ResponseMetadata"]["HTTPStatusCode"]
            expect(400 <= st < 500, f"PUT {k!r}: {e}")
    for k, b in stored.items():
        got = s3.get_object(Bucket=BUCKET, Key=k)["Body"].read()
        expect(got == b, f"{k!r}: read {len(got)} bytes, wrote {len(b)}")
    listed = all_keys()
    expect(sorted(listed) == sorted(stored), f"listing differs: {set(listed) ^ set(stored)}")
    expect(listed == sorted(listed, key=lambda s: s.encode()), "listing not in UTF-8 byte order")
    for k in stored:
        s3.delete_object(Bucket=BUCKET, Key=k)
    expect(all_keys() == [], "left after deletes")
    print(f"fuzzed keys: {len(keys)} tried, {len(stored)} stored, {len(keys) - len(stored)} refused")


@check
def suffix_ranges_larger_than_the_object_return_it_whole():
    s3.put_object(Bucket=BUCKET, Key="r", Body=b"0123456789")
    r = s3.get_object(Bucket=BUCKET, Key="r", Range="bytes=-100")
    expect(r["Body"].read() == b"0123456789", "body")
    r = s3.get_object(Bucket=BUCKET, Key="r", Range="bytes=-3")
    expect(r["Body"].read() == b"789" and r["ContentRange"] == "bytes 7-9/10", f"{r.get('ContentRange')}")
    c = code(lambda: s3.get_object(Bucket=BUCKET, Key="r", Range="bytes=10-"))
    expect(c == ("InvalidRange", 416), f"past the end: {c}")
    s3.delete_object(Bucket=BUCKET, Key="r")
    # No byte of an empty object can be asked for, by a suffix either.
    s3.put_object(Bucket=BUCKET, Key="e", Body=b"")
    for rng in ("bytes=-5", "bytes=0-0"):
        c = code(lambda: s3.get_object(Bucket=BUCKET, Key="e", Range=rng))
        expect(c == ("InvalidRange", 416), f"{rng} of an empty object: {c}")
    expect(s3.get_object(Bucket=BUCKET, Key="e")["Body"].read() == b"", "whole empty object")
    s3.delete_object(Bucket=BUCKET, Key="e")


@check
def url_encoded_listings_round_trip():
    keys = ["p/a+b", "p/100%", "p/sp ace", "p/é"]
    for k in keys:
        s3.put_object(Bucket=BUCKET, Key=k, Body=b"x")
    # botocore asks for encoding-type=url and decodes.
    expect(sorted(all_keys("p/")) == sorted(keys), f"{all_keys('p/')}")
    page = s3.list_objects(Bucket=BUCKET, Prefix="p/", Delimiter="/")
    expect(sorted(o["Key"] for o in page["Contents"]) == sorted(keys), "v1 listing")
    for k in keys:
        s3.delete_object(Bucket=BUCKET, Key=k)


@check
def listings_carry_etag_size_and_storage_class():
    put = s3.put_object(Bucket=BUCKET, Key="l/one", Body=b"abc")
    objs = s3.list_objects_v2(Bucket=BUCKET, Prefix="l/")["Contents"]
    o = objs[0]
    expect(o["ETag"] == put["ETag"], f"{o.get('ETag')} != {put['ETag']}")
    expect(o["Size"] == 3 and o["StorageClass"] == "STANDARD" and "LastModified" in o, f"{o}")
    expect(s3.list_objects(Bucket=BUCKET, Prefix="l/")["Contents"][0]["ETag"] == put["ETag"], "v1 ETag")
    s3.delete_object(Bucket=BUCKET, Key="l/one")


@check
def the_crt_client_lists_and_reads():
    from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client
    os.environ.update(AWS_ACCESS_KEY_ID=AK, AWS_SECRET_ACCESS_KEY=SK)
    keys = [f"crt/{i:03}" for i in range(25)]
    for k in keys:
        s3.put_object(Bucket=BUCKET, Key=k, Body=k.encode())
    c = MountpointS3Client("us-east-1", endpoint=ENDPOINT, force_path_style=True)
    seen = []
    for page in c.list_objects(BUCKET, "crt/"):
        seen += [o.key for o in page.object_info]
    expect(seen == keys, f"the CRT client listed {len(seen)} of {len(keys)}")
    expect(b"".join(c.get_object(BUCKET, "crt/007")) == b"crt/007", "CRT GET")
    s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys]})


@check
def errors_name_the_right_thing():
    expect(code(lambda: s3.get_object(Bucket="no-such-bucket", Key="k"))[0] == "NoSuchBucket", "GET missing bucket")
    expect(code(lambda: s3.list_objects_v2(Bucket="no-such-bucket"))[0] == "NoSuchBucket", "LIST missing bucket")
    expect(code(lambda: s3.put_object(Bucket="no-such-bucket", Key="k", Body=b""))[0] == "NoSuchBucket", "PUT")
    c = code(lambda: client(ak="unknown-key").list_objects_v2(Bucket=BUCKET))
    expect(c == ("InvalidAccessKeyId", 403), f"unknown access key: {c}")
    c = code(lambda: client(sk="wrong-secret").list_objects_v2(Bucket=BUCKET))
    expect(c == ("SignatureDoesNotMatch", 403), f"wrong secret: {c}")


@check
def quiet_deletes_are_quiet_and_loud_ones_list_keys():
    for k in ["d/1", "d/2"]:
        s3.put_object(Bucket=BUCKET, Key=k, Body=b"x")
    r = s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": "d/1"}], "Quiet": True})
    expect(not r.get("Deleted"), f"quiet delete listed {r.get('Deleted')}")
    r = s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": "d/2"}, {"Key": "never"}]})
    expect(sorted(d["Key"] for d in r["Deleted"]) == ["d/2", "never"], f"{r.get('Deleted')}")
    expect(all_keys("d/") == [], "deleted")


@check
def conditional_reads():
    etag = s3.put_object(Bucket=BUCKET, Key="c", Body=b"v1")["ETag"]
    lm = s3.head_object(Bucket=BUCKET, Key="c")["LastModified"]
    past, future = lm - datetime.timedelta(hours=1), lm + datetime.timedelta(hours=1)
    for op in (s3.get_object, s3.head_object):
        name = op.__name__
        expect(code(lambda: op(Bucket=BUCKET, Key="c", IfMatch=etag))[1] == 200, f"{name} If-Match same")
        expect(code(lambda: op(Bucket=BUCKET, Key="c", IfMatch='"0000"'))[1] == 412, f"{name} If-Match other")
        expect(code(lambda: op(Bucket=BUCKET, Key="c", IfNoneMatch=etag))[1] == 304, f"{name} If-None-Match same")
        expect(code(lambda: op(Bucket=BUCKET, Key="c", IfNoneMatch='"0000"'))[1] == 200, f"{name} If-None-Match other")
        expect(code(lambda: op(Bucket=BUCKET, Key="c", IfModifiedSince=future))[1] == 304, f"{name} If-Modified-Since")
        expect(code(lambda: op(Bucket=BUCKET, Key="c", IfModifiedSince=past))[1] == 200, f"{name} If-Modified-Since past")
        expect(code(lambda: op(Bucket=BUCKET, Key="c", IfUnmodifiedSince=past))[1] == 412, f"{name} If-Unmodified-Since")
        expect(code(lambda: op(Bucket=BUCKET, Key="c", IfUnmodifiedSince=future))[1] == 200, f"{name} If-Unmodified-Since future")
    # Conditional writes.
    expect(code(lambda: s3.put_object(Bucket=BUCKET, Key="c", Body=b"v2", IfNoneMatch="*"))[1] == 412, "If-None-Match: *")
    expect(code(lambda: s3.put_object(Bucket=BUCKET, Key="c", Body=b"v2", IfMatch=etag))[1] == 200, "If-Match on PUT")
    expect(s3.get_object(Bucket=BUCKET, Key="c")["Body"].read() == b"v2", "conditional PUT wrote")
    s3.delete_object(Bucket=BUCKET, Key="c")


@check
def checksums_are_stored_and_returned():
    sums = client(request_checksum_calculation="when_supported", response_checksum_validation="when_supported")
    body = os.urandom(100_000)
    put = sums.put_object(Bucket=BUCKET, Key="ck", Body=body, ChecksumAlgorithm="CRC64NVME")
    sent = put.get("ChecksumCRC64NVME")
    expect(sent, f"no checksum in the PUT reply: {put}")
    h = sums.head_object(Bucket=BUCKET, Key="ck", ChecksumMode="ENABLED")
    expect(h.get("ChecksumCRC64NVME") == sent and h.get("ChecksumType") == "FULL_OBJECT", f"HEAD {h}")
    g = sums.get_object(Bucket=BUCKET, Key="ck", ChecksumMode="ENABLED")
    expect(g["Body"].read() == body and g.get("ChecksumCRC64NVME") == sent, "GET checksum")
    # A PUT with SHA256 keeps it too.
    put = sums.put_object(Bucket=BUCKET, Key="ck2", Body=body, ChecksumAlgorithm="SHA256")
    h = sums.head_object(Bucket=BUCKET, Key="ck2", ChecksumMode="ENABLED")
    expect(h.get("ChecksumSHA256") == put.get("ChecksumSHA256") and h.get("ChecksumCRC64NVME") == sent, f"{h}")
    # A wrong checksum is refused and stores nothing.
    c = code(lambda: s3.put_object(Bucket=BUCKET, Key="bad", Body=b"abc", ChecksumCRC64NVME="AAAAAAAAAAA="))
    expect(c == ("BadDigest", 400), f"wrong checksum: {c}")
    expect(code(lambda: s3.head_object(Bucket=BUCKET, Key="bad"))[1] == 404, "bad PUT stored something")
    # Multipart: the full-object CRC64NVME equals the single-part one.
    mp = s3.create_multipart_upload(Bucket=BUCKET, Key="mp")
    big = body * 60  # 6 MB: two parts
    parts = []
    for n, chunk in enumerate([big[: 5 << 20], big[5 << 20:]], 1):
        p = s3.upload_part(Bucket=BUCKET, Key="mp", UploadId=mp["UploadId"], PartNumber=n, Body=chunk)
        parts.append({"PartNumber": n, "ETag": p["ETag"]})
    done = s3.complete_multipart_upload(Bucket=BUCKET, Key="mp", UploadId=mp["UploadId"], MultipartUpload={"Parts": parts})
    expect(done["ETag"].strip('"').endswith("-2"), f"multipart ETag {done['ETag']}")
    s3.put_object(Bucket=BUCKET, Key="sp", Body=big)
    a = s3.head_object(Bucket=BUCKET, Key="mp", ChecksumMode="ENABLED").get("ChecksumCRC64NVME")
    b = s3.head_object(Bucket=BUCKET, Key="sp", ChecksumMode="ENABLED").get("ChecksumCRC64NVME")
    expect(a and a == b, f"multipart CRC {a} != single-part {b}")
    expect(s3.get_object(Bucket=BUCKET, Key="mp")["Body"].read() == big, "multipart bytes")
    s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in ["ck", "ck2", "mp", "sp"]]})


@check
def multipart_rules():
    mp = s3.create_multipart_upload(Bucket=BUCKET, Key="m2")
    uid = mp["UploadId"]
    p1 = s3.upload_part(Bucket=BUCKET, Key="m2", UploadId=uid, PartNumber=1, Body=b"small")
    p2 = s3.upload_part(Bucket=BUCKET, Key="m2", UploadId=uid, PartNumber=2, Body=b"last")
    parts = [{"PartNumber": 1, "ETag": p1["ETag"]}, {"PartNumber": 2, "ETag": p2["ETag"]}]
    c = code(lambda: s3.complete_multipart_upload(Bucket=BUCKET, Key="m2", UploadId=uid, MultipartUpload={"Parts": parts}))
    expect(c[0] == "EntityTooSmall", f"small part: {c}")
    c = code(lambda: s3.complete_multipart_upload(Bucket=BUCKET, Key="m2", UploadId=uid,
                                                   MultipartUpload={"Parts": parts[::-1]}))
    expect(c[0] == "InvalidPartOrder", f"order: {c}")
    listed = s3.list_parts(Bucket=BUCKET, Key="m2", UploadId=uid)["Parts"]
    expect([p["PartNumber"] for p in listed] == [1, 2], f"{listed}")
    expect(any(u["UploadId"] == uid for u in s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])), "uploads")
    s3.abort_multipart_upload(Bucket=BUCKET, Key="m2", UploadId=uid)
    c = code(lambda: s3.upload_part(Bucket=BUCKET, Key="m2", UploadId=uid, PartNumber=3, Body=b"x"))
    expect(c[0] == "NoSuchUpload", f"after abort: {c}")
    c = code(lambda: s3.upload_part(Bucket=BUCKET, Key="m2", UploadId="../../etc", PartNumber=1, Body=b"x"))
    expect(c[0] == "NoSuchUpload", f"hostile upload id: {c}")
    expect(code(lambda: s3.head_object(Bucket=BUCKET, Key="m2"))[1] == 404, "aborted upload left an object")


@check
def copies_and_buckets():
    s3.put_object(Bucket=BUCKET, Key="src", Body=b"copy me", ContentType="text/plain", Metadata={"k": "v"})
    s3.copy_object(Bucket=BUCKET, Key="dst", CopySource={"Bucket": BUCKET, "Key": "src"})
    h = s3.head_object(Bucket=BUCKET, Key="dst")
    expect(h["ContentType"] == "text/plain" and h["Metadata"] == {"k": "v"}, f"{h}")
    expect(s3.get_object(Bucket=BUCKET, Key="dst")["Body"].read() == b"copy me", "copied bytes")
    s3.create_bucket(Bucket="made-here")
    expect(code(lambda: s3.create_bucket(Bucket="made-here"))[0] == "BucketAlreadyOwnedByYou", "again")
    s3.put_object(Bucket="made-here", Key="k", Body=b"x")
    expect(code(lambda: s3.delete_bucket(Bucket="made-here"))[0] == "BucketNotEmpty", "non-empty")
    s3.delete_object(Bucket="made-here", Key="k")
    s3.delete_bucket(Bucket="made-here")
    expect(code(lambda: s3.head_bucket(Bucket="made-here"))[1] == 404, "deleted bucket")
    expect(code(lambda: s3.create_bucket(Bucket="Bad_Name"))[0] == "InvalidBucketName", "bad name")
    s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": "src"}, {"Key": "dst"}]})


@check
def a_key_cannot_be_an_object_and_a_prefix():
    s3.put_object(Bucket=BUCKET, Key="obj", Body=b"1")
    c = code(lambda: s3.put_object(Bucket=BUCKET, Key="obj/child", Body=b"2"))
    expect(c == ("KeyConflict", 400), f"child of an object: {c}")
    s3.put_object(Bucket=BUCKET, Key="pre/child", Body=b"3")
    c = code(lambda: s3.put_object(Bucket=BUCKET, Key="pre", Body=b"4"))
    expect(c == ("KeyConflict", 400), f"object over a prefix: {c}")
    expect(s3.get_object(Bucket=BUCKET, Key="obj")["Body"].read() == b"1", "nothing changed")
    s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": "obj"}, {"Key": "pre/child"}]})


def main() -> int:
    failed = 0
    for name, err in results:
        if err is None:
            print(f"ok {name}")
        else:
            failed += 1
            print(f"FAIL {name}: {err}")
    print(f"checks={len(results)} failed={failed} keys={len(HOSTILE)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
