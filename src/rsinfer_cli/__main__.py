from .cli.app import main

if __name__ == "__main__":  # not when a worker process started by spawn imports it
    main()
