from shardkit.cli import main

main()
