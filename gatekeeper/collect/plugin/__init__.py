"""Put on PYTHONPATH of the test run (not imported from here): the pytest plugin the collector loads with -p."""
