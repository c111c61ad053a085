#!/usr/bin/env bash
echo "external checks: not written yet"
