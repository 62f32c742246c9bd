from tokendiff.cli import main

raise SystemExit(main())
