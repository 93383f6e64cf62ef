from kveval.cli.commands import main

main()
