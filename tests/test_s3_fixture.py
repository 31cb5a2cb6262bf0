import pytest
from pyarrow import fs

pytestmark = pytest.mark.s3


def test_s3_server_round_trips_an_object(s3_server):
    bucket = s3_server.new_bucket()
    filesystem, path = fs.FileSystem.from_uri(s3_server.uri(bucket, "a/b.bin"))
    with filesystem.open_output_stream(path) as out:
        out.write(b"hello")
    with filesystem.open_input_stream(path) as inp:
        assert inp.read() == b"hello"
