from tokendiff.cli.main import main

raise SystemExit(main())
