"""Fixtures shared by the security tests (material from ``helpers``)."""

from __future__ import annotations

import pytest

from .helpers import Pki, make_pki


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    """One trusted CA with a server certificate for 127.0.0.1/localhost (PKCS#8 and PKCS#1
    keys), and an untrusted CA; ``pki.client("role")`` issues client certificates."""
    return make_pki(tmp_path_factory.mktemp("pki"))
