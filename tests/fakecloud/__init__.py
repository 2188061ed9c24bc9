"""A checkout against a live server using the fakecloud provider (``bench/fakecloud``), for the drift tests."""
