"""Tests of the test kit itself (testkit/): the brokers it starts, the Java peer the parity suites
compare kdaemon with, and the rest of the machinery the suites stand on."""
