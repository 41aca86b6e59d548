"""``python -m cropscale`` -> :func:`cropscale.cli.main`."""

from cropscale.cli import main

if __name__ == "__main__":
    main()
