"""kopf logs in with the operator's own credentials: a token kubeconfig (a ServiceAccount's) as well as
client certificates (found on the real control plane: kopf went anonymous with a token kubeconfig)."""

from kvtier.controllers.runtime import connection_info

KUBECONFIG = """\
apiVersion: v1
kind: Config
current-context: c
clusters: [{name: k, cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: the-token}}]
contexts: [{name: c, context: {cluster: k, user: u}}]
"""


def test_a_token_kubeconfig_logs_kopf_in_with_the_token(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    info = connection_info(path)
    assert (info.server, info.scheme, info.token) == ("https://127.0.0.1:6443", "Bearer", "the-token")


def test_a_certificate_kubeconfig_sends_no_token(tmp_path):
    (tmp_path / "c.crt").write_text("x")
    (tmp_path / "c.key").write_text("x")
    path = tmp_path / "kubeconfig"
    path.write_text(
        KUBECONFIG.replace(
            "{token: the-token}", f"{{client-certificate: {tmp_path}/c.crt, client-key: {tmp_path}/c.key}}"
        )
    )
    info = connection_info(path)
    assert info.token is None and info.certificate_path and info.private_key_path
