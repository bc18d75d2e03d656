#!/usr/bin/env python3
"""Start the gateway: `python openai_api_cli.py --help`."""

import sys

from openai_api.cli import main

if __name__ == "__main__":
    sys.exit(main())
