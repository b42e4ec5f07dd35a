"""Helpers the test modules share (traces made from rows, fio's iolog): not test modules, so no test module
imports another (pytest collects every test_*.py once; importing one from another runs its module code twice
under two names)."""
