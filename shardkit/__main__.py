from shardkit.io.interrupts import record_early

record_early()  # before the imports: a signal now is answered like one during the run (exit 130/143, --json)

from shardkit.cli import main  # noqa: E402

main()
