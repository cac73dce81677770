from deepgemm.cli import main

raise SystemExit(main())
