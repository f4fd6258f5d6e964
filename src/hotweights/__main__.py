from hotweights.cli import main

raise SystemExit(main())
