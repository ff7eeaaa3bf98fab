import sys

from pask_agent.cli import main

sys.exit(main())
