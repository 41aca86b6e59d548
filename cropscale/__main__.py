"""``python -m cropscale`` -> :func:`cropscale.cli.main.main`."""

from cropscale.cli.main import main

if __name__ == "__main__":
    main()
