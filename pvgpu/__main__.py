import sys

from pvgpu.cli import main

sys.exit(main())
