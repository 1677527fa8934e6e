common_guards
expect_active "api running" api
finish
