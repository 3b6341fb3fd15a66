"""Under mpiexec a test that fails on one rank leaves the other ranks in a collective: once this
rank has reported, a failed session ends every rank with MPI_Abort instead of waiting for the
transport's timeout."""
import sys

_failed = []


def pytest_runtest_logreport(report):
    if report.failed:
        _failed.append(report.nodeid)


def pytest_unconfigure(config):
    if _failed:
        sys.stdout.flush()
        sys.stderr.flush()
        from gflow import _capi
        if _capi.initialized():
            _capi.abort(1)
