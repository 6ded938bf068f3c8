"""``AuthenticationProviderTls``: the role is the common name (CN) of the client's certificate
(method ``tls``).

The TLS layer (``auth/tls.py`` and the listeners) has already verified the certificate against
``tlsTrustCertsFilePath`` by the time this provider sees it, as the dict
``ssl.SSLSocket.getpeercert()`` returns. An unverified certificate (accepted under
``tlsAllowInsecureConnection``) yields an empty dict there, and counts as no certificate here,
as in Pulsar, where such a certificate is not used for authentication.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import AuthenticationFailed
from . import METHOD_TLS, Principal


def common_name(peer_cert: Mapping[str, Any] | None) -> str | None:
    """The subject's CN in ``getpeercert()`` form (the last one when there are several, the most
    specific in a DN written most-significant first)."""
    found = None
    for rdn in (peer_cert or {}).get("subject", ()):
        for attribute, value in rdn:
            if attribute == "commonName" and value:
                found = value
    return found


class TlsAuthenticationProvider:
    method = METHOD_TLS

    @classmethod
    def from_config(cls, config: Mapping[str, Any], environ: Mapping[str, str] | None = None):
        return cls()

    def authenticate(self, data: bytes, peer_cert: dict | None) -> Principal:
        if not peer_cert:
            raise AuthenticationFailed(
                "TLS authentication needs a client certificate that the broker trusts "
                "(connect over TLS with tlsCertificateFilePath/tlsKeyFilePath set on the client)"
            )
        role = common_name(peer_cert)
        if role is None:
            raise AuthenticationFailed("the client certificate has no common name (CN) to use as the role")
        return Principal(role, self.method, None)
