"""Tools run by make (`python -m scripts.<name>` from the checkout): benchmarks, the
memory check and tables, the resume check. A regular package, so no installed
package of the same name can stand in for it."""
