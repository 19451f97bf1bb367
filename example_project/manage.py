#!/usr/bin/env python
"""The shop's manage.py: ``.venv/bin/python example_project/manage.py idem_status``."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
