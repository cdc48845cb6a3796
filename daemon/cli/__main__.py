import sys

from vigil.daemon.cli import main

sys.exit(main())
