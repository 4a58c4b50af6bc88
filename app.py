"""SAFE Ensemble Studio, the web app, from a checkout: ``python app.py [--port 7860] [--models SPEC ...] ...``.

The same `main` as the installed ``safe-studio`` command; the app itself is `components.studio`.
"""

import sys

from components.studio import main

if __name__ == "__main__":
    sys.exit(main())
