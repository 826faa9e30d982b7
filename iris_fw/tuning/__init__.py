"""Tuning tables (data files): see iris_fw.engine.tuning."""
