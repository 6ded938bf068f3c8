"""What the integration tests share, in one place: a newcomer writing a test starts here.

- ``harness.broker``: a real standalone broker as a subprocess on free ports (``BrokerProcess``),
  ``free_port``, ``make_client`` (the official ``pulsar.Client`` with its C++ logging turned down),
  ``StandaloneInHome`` (a standalone started from a home directory's own configuration file).
- ``harness.fixtures``: the pytest fixtures built on it (``broker``, ``client``, ``topic``,
  ``compaction_factory``); a package's ``conftest.py`` imports the ones it wants.
- ``harness.http``: the admin REST API as a test sees it (``Http``, ``rest``, ``ok``, ``web``),
  and the admin-stats questions tests ask of a broker (``subscription_stats``, ``wait_backlog``...).
- ``harness.wait``: ``wait_until``, the ONE polling loop (a test never writes its own).
- ``harness.sockets``: ``closed_by_peer``, which raw sockets a broker closed, and when.
- ``harness.cli``: the ``compactmq`` command run in this process through ``main(argv)``, its
  stdout, stderr and exit status captured as a subprocess would have them (``run_cli``,
  ``admin_cli``): starting a Python process per command costs a second of CPU and proves nothing
  a test of the command's behaviour needs. Tests whose subject IS the process (the console script,
  ``standalone``, a crash) still start one.

``tests/`` is on ``sys.path`` in a test run (pytest's rootdir-relative imports), so these import
as ``from harness.broker import BrokerProcess``.
"""
