"""upstream.lock: schema validation, one-line errors naming key and file, determinism, atomic save."""

import pytest

from rocmport.errors import BadInput
from rocmport.upstream.lock import Lock, Pin, load_lock, parse_lock

SHA = "55ac7082517c3878ae653c07c09c534b8aed49f6"


def _pin(**kw):
    base = dict(
        url="https://github.com/NVIDIA/Megatron-LM.git",
        source="git",
        requested_ref="v0.16",
        resolved_ref="core_v0.16.1",
        commit=SHA,
        commit_date="2025-12-01T00:00:00+00:00",
        version="0.16.1",
    )
    base.update(kw)
    return Pin(**base)


def test_roundtrip_is_byte_identical(tmp_path):
    lock = Lock(upstreams={"megatron-bridge": _pin(chosen_by="gitlink-exact"), "megatron-lm": _pin()})
    path = tmp_path / "upstream.lock"
    lock.save(path)
    first = path.read_bytes()
    load_lock(path).save(path)
    assert path.read_bytes() == first
    text = first.decode()
    # contract keys, sorted, schema first
    assert text.index("schema_version: 1") < text.index("upstreams:")
    assert text.index("megatron-bridge:") < text.index("megatron-lm:")
    assert "chosen_by: gitlink-exact" in text


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda d: d.update(schema_version=2), "schema_version"),
        (lambda d: d["upstreams"]["megatron-lm"].pop("commit"), "upstreams.megatron-lm.commit"),
        (lambda d: d["upstreams"]["megatron-lm"].update(commit="abc"), "upstreams.megatron-lm.commit"),
        (lambda d: d["upstreams"]["megatron-lm"].update(source="svn"), "upstreams.megatron-lm.source"),
        (lambda d: d["upstreams"]["megatron-lm"].update(source="pypi"), "upstreams.megatron-lm.sdist"),
        (lambda d: d["upstreams"]["megatron-lm"].update(colour="red"), "upstreams.megatron-lm.colour"),
        (lambda d: d["upstreams"].update(apex={}), "upstreams.apex"),
    ],
)
def test_malformed_lock_names_key_and_file(tmp_path, mutate, key):
    data = Lock(upstreams={"megatron-lm": _pin()}).to_dict()
    mutate(data)
    import yaml

    path = tmp_path / "upstream.lock"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(BadInput) as err:
        load_lock(path)
    msg = str(err.value)
    assert str(path) in msg and f"'{key}'" in msg
    assert "\n" not in msg


def test_invalid_yaml_reports_line(tmp_path):
    with pytest.raises(BadInput, match=r"upstream.lock: not valid YAML at line 3"):
        parse_lock("schema_version: 1\nupstreams: [\n", "upstream.lock")


def test_missing_lock_says_what_to_do(tmp_path):
    with pytest.raises(BadInput, match="rocmport sync --ref"):
        load_lock(tmp_path / "upstream.lock")


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "upstream.lock"
    Lock(upstreams={"megatron-lm": _pin()}).save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["upstream.lock"]
