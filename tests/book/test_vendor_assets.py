"""scripts/vendor_assets.py: the book's front-end assets come from the exact tarballs that
package-lock.json pins, verified by hash, fetched with Python alone (no network here: the
download is replaced by a local tarball)."""
from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import json
import tarfile

import pytest

from repo_paths import REPO

spec = importlib.util.spec_from_file_location("vendor_assets", REPO / "scripts" / "vendor_assets.py")
vendor_assets = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vendor_assets)


def _tarball(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


class _Response(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_every_vendored_package_is_pinned_with_a_hash():
    pins = vendor_assets.pinned()
    assert set(pins) == set(vendor_assets.ASSETS) == set(vendor_assets.LICENSES)
    deps = json.loads((REPO / "package.json").read_text())["dependencies"]
    for name, (version, integrity) in pins.items():
        assert version == deps[name]
        assert integrity.startswith("sha512-"), f"{name}: no sha512 integrity in package-lock.json"


def test_tarball_url_follows_the_registry_layout():
    url = vendor_assets.tarball_url("@jupyter-widgets/html-manager", "1.0.15")
    assert url.endswith("/@jupyter-widgets/html-manager/-/html-manager-1.0.15.tgz")
    assert vendor_assets.tarball_url("mathjax", "3.2.2").endswith("/mathjax/-/mathjax-3.2.2.tgz")


def test_download_accepts_the_pinned_hash_and_refuses_another(monkeypatch):
    data = _tarball({"package.json": b'{"version": "1.0.0"}'})
    monkeypatch.setattr(vendor_assets.urllib.request, "urlopen",
                        lambda url, timeout: _Response(data))
    assert vendor_assets.download("pkg", "1.0.0", _integrity(data)) == data
    with pytest.raises(SystemExit, match="package-lock.json expects"):
        vendor_assets.download("pkg", "1.0.0", _integrity(data + b"tampered"))


def test_unpack_puts_the_package_in_its_folder(tmp_path):
    pkg = vendor_assets.unpack(_tarball({"es5/tex-chtml.js": b"// js"}), tmp_path)
    assert (pkg / "es5" / "tex-chtml.js").read_bytes() == b"// js"
