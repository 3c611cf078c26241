"""The build backend of idempotency-pg: setuptools' own (setuptools.build_meta),
after a check that the Python building it has what a wheel needs.

`pip install --no-build-isolation` (the offline install of the README) builds
with the setuptools and wheel of the Python that runs pip.  When that is not
the Python meant (another python3 first on PATH: pyenv, /usr/local, a venv
made from it), setuptools fails deep inside with "invalid command
'bdist_wheel'" or pip with "Cannot import 'setuptools.build_meta'", and
nothing says which Python it was.  This names the Python, what it lacks and
the ways out.
"""
import shutil
import sys


def _refusal(missing):
    made_from = f", a venv of the Python in {sys.base_prefix}" if sys.prefix != sys.base_prefix else ""
    on_path = shutil.which("python3") or "none"
    return (
        f"idempotency-pg cannot be built by this Python: {missing}.\n"
        f"  The Python running pip: {sys.executable} (Python {sys.version.split()[0]}{made_from}).\n"
        f"  python3 first on PATH: {on_path}.\n"
        "  pip install --no-build-isolation builds with the setuptools and wheel of the Python that runs pip."
        " If that is not the Python you meant, make the venv with the one you meant, e.g. Debian's:"
        " /usr/bin/python3 -m venv --system-site-packages .venv (python3-setuptools and python3-wheel, which"
        " python3-pip installs); or install what is missing into this Python (pip install setuptools wheel);"
        " or leave out --no-build-isolation to let pip fetch them (network access to PyPI)."
    )


try:
    from setuptools import build_meta as _setuptools
except ImportError as e:        # said when a hook is called: an import error here would be pip's "Cannot import"
    _setuptools, _no_setuptools = None, e


def _need_setuptools():
    if _setuptools is None:
        raise RuntimeError(_refusal(f"it has no setuptools ({_no_setuptools})")) from None


def _can_build_wheels():
    """setuptools makes wheels with its bdist_wheel command: its own from setuptools
    70.1, the wheel package's before."""
    _need_setuptools()
    from setuptools.dist import Distribution
    try:
        Distribution().get_command_class("bdist_wheel")
    except Exception as e:       # distutils' DistutilsModuleError: invalid command 'bdist_wheel'
        import setuptools
        raise RuntimeError(_refusal(f"its setuptools {setuptools.__version__} has no bdist_wheel command ({e}),"
                                    " which the wheel package gives setuptools before 70.1")) from None


def get_requires_for_build_wheel(config_settings=None):
    _need_setuptools()
    return _setuptools.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    _need_setuptools()
    return _setuptools.get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _can_build_wheels()
    return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _can_build_wheels()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    _need_setuptools()
    return _setuptools.build_sdist(sdist_directory, config_settings)


# PEP 660 editable installs (pip install -e), where this setuptools has them
if hasattr(_setuptools, "build_editable"):
    def get_requires_for_build_editable(config_settings=None):
        _need_setuptools()
        return _setuptools.get_requires_for_build_editable(config_settings)

    def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
        _can_build_wheels()
        return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)

    def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
        _can_build_wheels()
        return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
