"""tools/install.py hands pip's configuration to uv: a machine whose torch wheel or registry mirror is configured for
pip installs the same packages through uv."""

import importlib.util

from conftest import ROOT

spec = importlib.util.spec_from_file_location("install", ROOT / "tools" / "install.py")
install = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install)

LISTING = """global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
global.index-url='https://mirror.example/simple'
:env:.index-url='https://other.example/simple'
:env:.find-links='/opt/wheels /srv/wheels'
:env:.default-timeout='180'
"""


def test_pips_indexes_wheels_and_constraints_become_uvs_options():
    assert install.pip_options(LISTING) == [
        "--index-url=https://mirror.example/simple",  # uv takes one index: pip's first
        "--extra-index-url=file:///opt/pypi/simple", "--extra-index-url=file:///opt/pypi-more/simple",
        "--find-links=/opt/wheels", "--find-links=/srv/wheels",  # each once, in pip's order
        "--constraint=/etc/xdg/pip/constraints.txt",
        "--index-strategy=unsafe-best-match",  # pip's rule across indexes: the best version from any
    ]


def test_no_configuration_gives_no_options():
    assert install.pip_options("global.cert='/etc/ssl/certs/ca-certificates.crt'\n") == []
