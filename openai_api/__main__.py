"""`python -m openai_api`: the `openai-api` command (the gateway, or `check-config`)."""

import sys

from openai_api.cli import main

sys.exit(main())
