"""Two small tools the calibration tests record traces with (as functions, the way users pass
them to ``rt.chat(tools=...)``)."""


def get_weather(city: str, unit: str = "celsius") -> str:
    """Get the current weather in a city.

    Args:
        city: The city name, e.g. Oslo.
        unit: Temperature unit, celsius or fahrenheit.
    """
    return "sunny"


def convert_currency(amount: float, source: str, target: str) -> float:
    """Convert an amount of money between currencies.

    Args:
        amount: How much money.
        source: Three-letter code of the currency to convert from.
        target: Three-letter code of the currency to convert to.
    """
    return amount
