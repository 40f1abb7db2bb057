"""``kdsync pki``: a group CA and member certificates a config can point at."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from kdsync.cli import main


def _member_config(tmp_path: Path, pki: Path, member: str) -> Path:
    config = {
        "group": "payments",
        "member": member,
        "members": [
            {"name": "east", "peer": "127.0.0.1:7401", "kafka": {"bootstrapServers": "k1:9092"}},
            {"name": "west", "peer": "127.0.0.1:7402", "kafka": {"bootstrapServers": "k2:9092"}},
            {"name": "tie", "peer": "127.0.0.1:7403", "witness": True},
        ],
        "topics": {"names": ["orders"]},
        "tls": {
            "ca": str(pki / "ca.pem"),
            "cert": str(pki / "members" / member / "cert.pem"),
            "key": str(pki / "members" / member / "key.pem"),
        },
    }
    path = tmp_path / f"{member}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_pki_from_a_config_makes_that_config_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pki = tmp_path / "pki"
    config = _member_config(tmp_path, pki, "east")
    assert main(["check-config", "--config", str(config)]) == 2  # files missing yet
    assert "kdsync pki" in capsys.readouterr().err
    assert main(["pki", "--config", str(config), "--out", str(pki)]) == 0
    out = capsys.readouterr().out
    assert "member tie" in out and f"cert: {pki.resolve()}/members/east/cert.pem" in out
    assert main(["check-config", "--config", str(config)]) == 0

    ca = x509.load_pem_x509_certificate((pki / "ca.pem").read_bytes())
    for member in ("east", "west", "tie"):
        cert = x509.load_pem_x509_certificate((pki / "members" / member / "cert.pem").read_bytes())
        cert.verify_directly_issued_by(ca)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
            f"kdsync://payments/{member}"
        ]
        key_mode = stat.S_IMODE((pki / "members" / member / "key.pem").stat().st_mode)
        assert key_mode == 0o600
    assert stat.S_IMODE((pki / "ca-key.pem").stat().st_mode) == 0o600


def test_running_again_keeps_the_ca_and_issues_only_new_members(tmp_path: Path) -> None:
    out = tmp_path / "pki"
    assert main(["pki", "--group", "g1", "--members", "a,b", "--out", str(out)]) == 0
    ca_before = (out / "ca.pem").read_bytes()
    a_before = (out / "members" / "a" / "cert.pem").read_bytes()
    assert main(["pki", "--group", "g1", "--members", "a,b,c", "--out", str(out)]) == 0
    assert (out / "ca.pem").read_bytes() == ca_before
    assert (out / "members" / "a" / "cert.pem").read_bytes() == a_before
    ca = x509.load_pem_x509_certificate(ca_before)
    c_cert = x509.load_pem_x509_certificate((out / "members" / "c" / "cert.pem").read_bytes())
    c_cert.verify_directly_issued_by(ca)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--group", "g1", "--members", "ok,bad name"], "invalid group/member name 'bad name'"),
        (["--group", "g1", "--members", "a,a"], "duplicate member names"),
        (["--group", "g1"], "name the group and its members"),
    ],
)
def test_bad_input_is_named_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = tmp_path / "pki"
    assert main(["pki", *args, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not (out / "members").exists()
