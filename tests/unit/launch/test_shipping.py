"""What a service started on another host gets from `up`'s machine: only its role's keys,
the secret and (hub) the config, under RUN_DIR/private/INSTANCE, named so on its command line."""

from __future__ import annotations

import io
import stat
import tarfile
from pathlib import Path

from grpo_stream.launch.shipping import role_key_files, shipment, unpack
from grpo_stream.launch.supervisor import ServiceSpec
from grpo_stream.transport.curve import init_keys


def _spec(service: str, *argv: str) -> ServiceSpec:
    return ServiceSpec(f"{service}-0", service, ["python", "-m", "grpo_stream.cli.main", *argv])


def test_a_generator_gets_its_pair_and_the_servers_public_key_only(tmp_path: Path) -> None:
    init_keys(tmp_path / "keys")
    (tmp_path / "secret").write_text("ab" * 32)
    spec = _spec("generator", "--keys-dir", str(tmp_path / "keys"),
                 "--secret-file", str(tmp_path / "secret"))  # fmt: skip
    ship = shipment(spec, Path("/runs/r"))
    assert sorted(ship.files) == [
        "keys/generator.key", "keys/generator.key_secret", "keys/server.key", "secret"]  # fmt: skip
    assert ship.directory == "/runs/r/private/generator-0"
    assert ship.argv[-4:] == ["--keys-dir", "/runs/r/private/generator-0/keys",
                              "--secret-file", "/runs/r/private/generator-0/secret"]  # fmt: skip
    assert "ab" * 32 not in " ".join(ship.argv)


def test_binding_roles_get_the_server_pair_and_the_allow_list(tmp_path: Path) -> None:
    init_keys(tmp_path / "keys")
    hub = shipment(_spec("grouper", "--keys-dir", str(tmp_path / "keys")), tmp_path)
    assert {f for f in hub.files if f.endswith("_secret")} == {"keys/server.key_secret"}
    assert "keys/authorized/trainer.key" in hub.files
    serving = role_key_files("generator", serves=True)
    assert "server.key_secret" in serving and "authorized" in serving
    assert "server.key_secret" not in role_key_files("scorer", serves=True)


def test_the_hub_takes_its_config_along(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text("[run]\nmax_steps = 3\n")
    ship = shipment(_spec("grouper", "--config", str(tmp_path / "run.toml")), tmp_path)
    assert ship.files == {"config.toml": b"[run]\nmax_steps = 3\n"}
    assert ship.argv[-1].endswith("private/grouper-0/config.toml")


def test_unpacked_files_are_private(tmp_path: Path) -> None:
    unpack({"secret": b"x", "keys/a.key_secret": b"y"}, tmp_path / "private")
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "private" / "keys").stat().st_mode) == 0o700
    for path in ("secret", "keys/a.key_secret"):
        assert stat.S_IMODE((tmp_path / "private" / path).stat().st_mode) == 0o600


def test_the_tar_stream_holds_the_files(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("cd" * 32)
    ship = shipment(_spec("scorer", "--secret-file", str(tmp_path / "secret")), tmp_path)
    with tarfile.open(fileobj=io.BytesIO(ship.tar()), mode="r:gz") as tar:
        member = tar.extractfile("secret")
        assert member is not None and member.read() == b"cd" * 32
