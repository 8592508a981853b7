from llm_watchdog.entry import main

if __name__ == "__main__":
    main()
